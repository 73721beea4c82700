"""The files a command reads include the external data files of its models and the files its
``--evaluate`` command names; the files it writes include ``OUT.onnx.data``. No output may be any of
them: each case exits 2 with one line naming both files, before any work, and every input keeps
its bytes (SHA-256) while nothing new appears.
"""
from __future__ import annotations

import hashlib
import shlex
import sys

import models_sensitivity as ms
import numpy as np
import onnx
import pytest

from quantdbg.cli import main
from quantdbg.errors import ConfigError
from quantdbg.model import save_model
from quantdbg.model.load import as_loaded, data_files_of
from quantdbg.model.save import data_path
from quantdbg.qdq import quantize
from quantdbg.report import write_report

NEVER = "choose another output path (inputs are never overwritten)."
PYTHON = shlex.quote(sys.executable)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """``model_fp32.onnx`` whose weights live in ``model.onnx.data`` (the name ``--out model.onnx``
    gives its own data file), its Q/DQ form ``q.onnx`` + ``q.onnx.data``, data, and a scoring script."""
    folder = tmp_path_factory.mktemp("data_files")
    onnx.save_model(ms.mlp4(width=32), str(folder / "model_fp32.onnx"), save_as_external_data=True,
                    location="model.onnx.data")
    x = np.random.default_rng(0).standard_normal((24, 32)).astype(np.float32)
    np.savez(folder / "calib.npz", x=x)
    np.savez(folder / "eval.npz", x=x)
    np.save(folder / "labels.npy", np.zeros(24, np.int64))
    quantize(str(folder / "model_fp32.onnx"), str(folder / "calib.npz")).save(folder / "q.onnx")
    (folder / "score.py").write_text("print(1.0)\n")
    assert sorted(p.name for p in folder.iterdir()) == [
        "calib.npz", "eval.npz", "labels.npy", "model.onnx.data", "model_fp32.onnx", "q.onnx", "q.onnx.data",
        "score.py"]
    return folder


def _digests(folder):
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def _refused(folder, capsys, monkeypatch, argv, message):
    monkeypatch.chdir(folder)
    before = _digests(folder)
    capsys.readouterr()
    assert main(argv) == 2
    assert capsys.readouterr().err == f"quantdbg {argv[0]}: error: {message}\n"
    assert _digests(folder) == before  # every input byte-identical, nothing written


FP32_DATA = "the external data file of the input MODEL 'model_fp32.onnx'; " + NEVER
EVALUATE = f"{PYTHON} score.py {{model}}"
CASES = {
    "calibrate --out gives its data file the input's": (
        ["calibrate", "model_fp32.onnx", "--data", "calib.npz", "--out", "model.onnx"],
        "--out 'model.onnx' may write its weights to 'model.onnx.data', which is " + FP32_DATA),
    "calibrate --cache on the input's data file": (
        "calibrate model_fp32.onnx --data calib.npz --out x.onnx --cache model.onnx.data".split(),
        "--cache 'model.onnx.data' is " + FP32_DATA),
    "analyze --out on the input's data file": (
        "analyze model_fp32.onnx --data calib.npz --eval eval.npz --out model.onnx.data".split(),
        "--out 'model.onnx.data' is " + FP32_DATA),
    "fallback --plan on the input's data file": (
        ["fallback", "model_fp32.onnx", "--data", "calib.npz", "--eval", "eval.npz", "--min-sqnr", "30",
         "--out", "x.onnx", "--plan", "model.onnx.data"], "--plan 'model.onnx.data' is " + FP32_DATA),
    "fallback --out gives its data file --fp32's": (
        ["fallback", "q.onnx", "--fp32", "model_fp32.onnx", "--eval", "eval.npz", "--min-sqnr", "30",
         "--out", "model.onnx", "--plan", "p.json"],
        "--out 'model.onnx' may write its weights to 'model.onnx.data', which is the external data file of "
        "the input --fp32 'model_fp32.onnx'; " + NEVER),
    "doctor --md on the input's data file": (
        ["doctor", "model_fp32.onnx", "--data", "calib.npz", "--md", "model.onnx.data"],
        "--md 'model.onnx.data' is " + FP32_DATA),
    "lint --json on the linted model's data file": (
        ["lint", "q.onnx", "--json", "q.onnx.data"],
        "--json 'q.onnx.data' is the external data file of the input MODEL 'q.onnx'; " + NEVER),
    "calibrate --cache on --out's data file": (
        "calibrate model_fp32.onnx --data calib.npz --out q2.onnx --cache q2.onnx.data".split(),
        "--cache 'q2.onnx.data' is also where the --out output 'q2.onnx' may write its weights; give each "
        "output its own path."),
    "auto --html on the --evaluate script": (
        ["auto", "model_fp32.onnx", "--data", "calib.npz", "--eval", "eval.npz", "--evaluate", EVALUATE,
         "--max-rel-loss", "1", "--out", "x.onnx", "--plan", "p.json", "--html", "score.py"],
        "--html 'score.py' is a file the --evaluate command reads; " + NEVER),
    "auto --plan on an --opt=FILE of --evaluate": (
        ["auto", "model_fp32.onnx", "--data", "calib.npz", "--eval", "eval.npz", "--evaluate",
         EVALUATE + " --labels=labels.npy", "--max-rel-loss", "1", "--out", "x.onnx", "--plan", "labels.npy"],
        "--plan 'labels.npy' is a file the --evaluate command reads; " + NEVER),
    "auto --out gives its data file the input's": (
        ["auto", "model_fp32.onnx", "--data", "calib.npz", "--eval", "eval.npz", "--min-sqnr", "30", "--out",
         "model.onnx", "--plan", "p.json"],
        "--out 'model.onnx' may write its weights to 'model.onnx.data', which is " + FP32_DATA),
    "apply --out gives its data file the input's": (
        "apply p.json model_fp32.onnx --data calib.npz --out model.onnx".split(),
        "--out 'model.onnx' may write its weights to 'model.onnx.data', which is " + FP32_DATA),
    "analyze --out on the --evaluate script": (
        ["analyze", "model_fp32.onnx", "--data", "calib.npz", "--eval", "eval.npz", "--mode", "isolated",
         "--evaluate", EVALUATE, "--out", "score.py"],
        "--out 'score.py' is a file the --evaluate command reads; " + NEVER),
}


@pytest.mark.parametrize("case", list(CASES))
def test_an_output_on_a_file_the_command_reads_or_writes_is_refused(folder, capsys, monkeypatch, case):
    argv, message = CASES[case]
    _refused(folder, capsys, monkeypatch, argv, message)


def test_the_data_files_of_a_model_file_are_found_without_reading_weights(folder, tmp_path):
    assert data_files_of(folder / "model_fp32.onnx") == (folder.resolve() / "model.onnx.data",)
    assert data_files_of(folder / "calib.npz") == ()  # not a model: nothing (loading it says why)
    onnx.save_model(ms.mlp4(), str(tmp_path / "inline.onnx"))
    assert data_files_of(tmp_path / "inline.onnx") == ()
    assert data_path(tmp_path / "q.onnx") == tmp_path / "q.onnx.data"


def test_saving_over_the_data_file_a_model_still_reads_is_refused(folder, tmp_path):
    """A model loaded from a.onnx with its weights in model.onnx.data, saved as model.onnx: its own
    data file would replace the one it (and a.onnx) read weights from."""
    for name in ("model_fp32.onnx", "model.onnx.data", "calib.npz"):
        (tmp_path / name).write_bytes((folder / name).read_bytes())
    before = _digests(tmp_path)
    qmodel = quantize(str(tmp_path / "model_fp32.onnx"), str(tmp_path / "calib.npz"))
    data = str(tmp_path / "model.onnx.data")
    with pytest.raises(ConfigError) as refused:
        qmodel.save(tmp_path / "model.onnx")
    assert str(refused.value) == (f"Cannot save the model: {str(tmp_path / 'model.onnx')!r} would write its "
                                  f"weights to {data!r}, which is the data file it still reads its weights "
                                  "from; save it under another name.")
    with pytest.raises(ConfigError, match=r"^Cannot save the model: '.*model\.onnx\.data' is the data file "
                                          r"it still reads its weights from"):
        save_model(as_loaded(str(tmp_path / "model_fp32.onnx")).proto, tmp_path / "model.onnx.data")
    assert _digests(tmp_path) == before
    qmodel.save(tmp_path / "q.onnx")  # any other name is fine, and leaves the inputs as they were
    assert (tmp_path / "q.onnx.data").is_file() and _digests(tmp_path).items() >= before.items()


def test_write_report_refuses_two_formats_on_one_path(tmp_path):
    report = as_loaded  # any object: the paths are checked before anything is rendered
    with pytest.raises(ConfigError, match=r"^html and markdown are both '.*r\.txt'; give each output its own "
                                          r"path\.$"):
        write_report(report, markdown=tmp_path / "r.txt", html=tmp_path / "r.txt")
    assert list(tmp_path.iterdir()) == []
