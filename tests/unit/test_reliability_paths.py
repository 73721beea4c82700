"""Outputs never overwrite inputs or each other, and a set of outputs appears together or not at all.

Every case checks the exit status, the exact one-line message, that no input's bytes changed and
that nothing new appeared in the folder (the check comes before any work).
"""
from __future__ import annotations

import hashlib
import os

import models_sensitivity as ms
import pytest

import quantdbg.cli.calibrate as calibrate
from quantdbg._io import commit_together
from quantdbg.cli import main
from quantdbg.fallback import FallbackPlan

NEVER = "choose another output path (inputs are never overwritten)."


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """FP32 mlp4, a Q/DQ version, calibration/eval data and a sensitivity result to report on."""
    return ms.write_cli_folder(tmp_path_factory.mktemp("paths"))


def _state(folder):
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def _refused(capsys, folder, argv, message):
    """Runs ``argv`` (names in the folder) and asserts status 2, ``message`` and an untouched folder."""
    before = _state(folder)
    capsys.readouterr()
    argv = [str(folder / a) if (folder / a).exists() or a.endswith((".onnx", ".json", ".md", ".html"))
            else a for a in argv]
    assert main(argv) == 2
    command = argv[0]
    message = message.format(d=str(folder))
    assert capsys.readouterr().err == f"quantdbg {command}: error: {message}\n"
    assert _state(folder) == before


CASES = [
    (["analyze", "q.onnx", "--fp32", "m.onnx", "--eval", "eval.npz", "--out", "m.onnx"],
     "--out '{d}/m.onnx' is the input --fp32; " + NEVER),
    (["analyze", "m.onnx", "--data", "calib.npz", "--eval", "eval.npz", "--out", "m.onnx"],
     "--out '{d}/m.onnx' is the input MODEL; " + NEVER),
    (["fallback", "q.onnx", "--fp32", "m.onnx", "--eval", "eval.npz", "--min-sqnr", "30", "--out",
      "x.onnx", "--plan", "q.onnx"], "--plan '{d}/q.onnx' is the input MODEL; " + NEVER),
    (["fallback", "q.onnx", "--fp32", "m.onnx", "--eval", "eval.npz", "--min-sqnr", "30", "--out",
      "x.onnx", "--plan", "r.json", "--report", "r.json"],
     "--plan '{d}/r.json' is the input --report; " + NEVER),
    (["fallback", "q.onnx", "--fp32", "m.onnx", "--eval", "eval.npz", "--min-sqnr", "30", "--out",
      "x.onnx", "--plan", "x.onnx"], "--plan '{d}/x.onnx' is also the --out output; give each output its own "
     "path."),
    (["lint", "q.onnx", "--json", "q.onnx"], "--json '{d}/q.onnx' is the input MODEL; " + NEVER),
    (["doctor", "m.onnx", "--data", "calib.npz", "--json", "m.onnx"],
     "--json '{d}/m.onnx' is the input MODEL; " + NEVER),
    (["doctor", "m.onnx", "--data", "calib.npz", "--eval", "eval.npz", "--md", "eval.npz"],
     "--md '{d}/eval.npz' is the input --eval; " + NEVER),
    (["report", "r.json", "--md", "r.json"], "--md '{d}/r.json' is the input RESULT; " + NEVER),
    (["calibrate", "m.onnx", "--data", "calib.npz", "--out", "calib.npz"],
     "--out '{d}/calib.npz' is the input --data; " + NEVER),
    (["calibrate", "m.onnx", "--data", "calib.npz", "--out", "x.onnx", "--cache", "x.onnx"],
     "--cache '{d}/x.onnx' is also the --out output; give each output its own path."),
    (["auto", "m.onnx", "--data", "calib.npz", "--eval", "eval.npz", "--metric", "sqnr", "--max-rel-loss",
      "1", "--out", "x.onnx", "--plan", "eval.npz"], "--plan '{d}/eval.npz' is the input --eval; " + NEVER),
    (["calibrate", "m.onnx", "--data", "calib.npz", "--out", "."],
     "--out '{d}' is a folder; give a file path inside it."),
]


@pytest.mark.parametrize(("argv", "message"), CASES, ids=[" ".join(c[0][:1] + c[0][-2:]) for c in CASES])
def test_an_output_that_is_an_input_or_another_output_is_refused_before_any_work(folder, capsys, argv,
                                                                                message):
    _refused(capsys, folder, argv, message)


def test_an_input_reached_through_a_symlink_is_still_an_input(folder, capsys, tmp_path):
    link = tmp_path / "alias.onnx"
    link.symlink_to(folder / "m.onnx")
    before = _state(folder)
    assert main(["calibrate", str(link), "--data", str(folder / "calib.npz"), "--out",
                 str(folder / "m.onnx")]) == 2
    assert capsys.readouterr().err == (f"quantdbg calibrate: error: --out {str(folder / 'm.onnx')!r} is the "
                                       f"input MODEL ({str(link)!r}); " + NEVER + "\n")
    assert _state(folder) == before


def test_demo_out_that_is_a_file_is_refused(folder, capsys):
    before = _state(folder)
    assert main(["demo", "--out", str(folder / "r.json")]) == 2
    assert capsys.readouterr().err == (f"quantdbg demo: error: --out {str(folder / 'r.json')!r} is a file, "
                                       "not a folder; give a folder path.\n")
    assert _state(folder) == before


@pytest.mark.skipif(os.geteuid() == 0, reason="permission bits do not bind root")
def test_a_read_only_folder_is_refused_before_any_work(folder, capsys, tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    assert main(["lint", str(folder / "q.onnx"), "--json", str(locked / "x.json")]) == 2
    assert capsys.readouterr().err == (f"quantdbg lint: error: --json {str(locked / 'x.json')!r}: folder "
                                       f"{str(locked)!r} is not writable; choose another folder.\n")


def test_commit_together_publishes_all_or_nothing(tmp_path):
    (tmp_path / "model.onnx").write_bytes(b"old model")
    with pytest.raises(RuntimeError, match="disk full"):
        with commit_together({"model": tmp_path / "model.onnx", "cache": None,
                              "plan": tmp_path / "plan.json"}) as staged:
            model = staged["model"]
            assert list(staged) == ["model", "plan"]
            assert model.name == "model.onnx" and model.parent != tmp_path
            model.write_bytes(b"new model")
            (model.parent / "model.onnx.data").write_bytes(b"weights")
            raise RuntimeError("disk full")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.onnx"]
    assert (tmp_path / "model.onnx").read_bytes() == b"old model"
    with commit_together({"model": tmp_path / "model.onnx", "plan": tmp_path / "plan.json"}) as staged:
        staged["model"].write_bytes(b"new model")
        (staged["model"].parent / "model.onnx.data").write_bytes(b"weights")
        staged["plan"].write_text("{}")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.onnx", "model.onnx.data", "plan.json"]
    assert (tmp_path / "model.onnx").read_bytes() == b"new model"


def test_a_write_failure_leaves_neither_the_model_nor_its_cache(folder, capsys, tmp_path, monkeypatch):
    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(calibrate, "write_trt_cache", full_disk)
    out, cache = tmp_path / "q.onnx", tmp_path / "c.cache"
    assert main(["calibrate", str(folder / "m.onnx"), "--data", str(folder / "calib.npz"), "--out", str(out),
                 "--cache", str(cache), "--no-progress"]) == 2
    assert capsys.readouterr().err == (f"quantdbg calibrate: error: Cannot write {str(out)!r}, "
                                       f"{str(cache)!r}: No space left on device; nothing was written.\n")
    assert list(tmp_path.iterdir()) == []


def test_a_plan_that_cannot_be_written_leaves_no_mixed_model(folder, capsys, tmp_path, monkeypatch):
    def full_disk(self, path):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(FallbackPlan, "write", full_disk)
    out, plan = tmp_path / "mixed.onnx", tmp_path / "plan.json"
    assert main(["fallback", str(folder / "q.onnx"), "--fp32", str(folder / "m.onnx"), "--eval",
                 str(folder / "eval.npz"), "--min-sqnr", "30", "--out", str(out), "--plan", str(plan)]) == 2
    assert capsys.readouterr().err == (f"quantdbg fallback: error: Cannot write {str(out)!r}, {str(plan)!r}: "
                                       "No space left on device; nothing was written.\n")
    assert [p.name for p in tmp_path.iterdir()] == ["plan.json.partial"]  # the journal: a rerun resumes
