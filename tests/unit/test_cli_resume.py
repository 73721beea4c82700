"""Resuming ``auto``, ``fallback`` and ``analyze`` from their journal: killed (SIGKILL) or stopped
(SIGINT, SIGTERM) at any point, a rerun makes only the evaluations not recorded and ends where an
uninterrupted run ends; a journal whose evaluation command (or a file it reads) changed is refused
with the file named; ``--restart`` starts over; a run that failed before any evaluation leaves none."""
from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time

import models_sensitivity as ms
import numpy as np
import onnxruntime as ort
import pytest

from quantdbg._journal import Journal
from quantdbg.cli import main
from quantdbg.cli._signals import Stopped, message
from quantdbg.fallback import FallbackPlan
from quantdbg.pipeline import AutoResult

# Scores a model by its outputs' relative error against FP32 (1 = exact) and counts its calls; the call
# numbered by the file `hang` (if present) records its pid and hangs, standing in for a long evaluation.
SCORE = """\
import os, sys, time
folder = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(folder, "calls"), "a") as f:
    f.write("x")
calls = len(open(os.path.join(folder, "calls")).read())
hang = os.path.join(folder, "hang")
if os.path.exists(hang) and calls == int(open(hang).read()):
    os.remove(hang)
    open(os.path.join(folder, "pid"), "w").write(str(os.getpid()))
    time.sleep(120)
if os.path.exists(os.path.join(folder, "fail")) and calls == int(open(os.path.join(folder, "fail")).read()):
    sys.exit("evaluation failed")
import numpy as np
import onnxruntime as ort
import helper
data = np.load(os.path.join(folder, "eval.npz"))
out = ort.InferenceSession(sys.argv[1], providers=["CPUExecutionProvider"]).run(None, {"x": data["x"]})[0]
print(helper.SCALE * (1 - np.linalg.norm(out - data["ref"]) / np.linalg.norm(data["ref"])))
"""


def _files(folder):
    """The four-layer MLP (one layer clipped hard in its Q/DQ form), its data with the FP32 outputs,
    the scoring script and the module it imports, in ``folder``; calls are counted in ``calls``."""
    x = ms.write_mlp4_pair(folder)
    fp32 = ort.InferenceSession(str(folder / "m.onnx"), providers=["CPUExecutionProvider"])
    ref = fp32.run(None, {"x": x})[0]
    np.savez(folder / "eval.npz", x=x, ref=ref, label=ref.argmax(axis=1), short=ref.argmax(axis=1)[1:])
    np.savez(folder / "calib.npz", x=x)
    (folder / "score.py").write_text(SCORE)
    (folder / "helper.py").write_text("SCALE = 1.0\n")
    (folder / "tmp").mkdir()
    return folder


@pytest.fixture
def job(tmp_path):
    return _files(tmp_path)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """Command -> (its run, the evaluations it made, its folder) of an uninterrupted run."""
    found = {}
    for name, argv in (("fallback", _fallback), ("auto", _auto)):
        folder = _files(tmp_path_factory.mktemp(name))
        done = _cli(folder, argv(folder, folder))
        assert done.returncode in (0, 1), done.stderr
        found[name] = (done, _calls(folder), folder)
    return found


def _command(folder) -> str:
    return f"{shlex.quote(sys.executable)} {shlex.quote(str(folder / 'score.py'))} {{model}}"


def _fallback(folder, out) -> list[str]:
    return ["fallback", str(folder / "q.onnx"), "--fp32", str(folder / "m.onnx"), "--eval",
            str(folder / "eval.npz"), "--evaluate", _command(folder), "--max-rel-loss", "0.5", "--out",
            str(out / "mixed.onnx"), "--plan", str(out / "plan.json")]


def _auto(folder, out) -> list[str]:
    return ["auto", str(folder / "m.onnx"), "--data", str(folder / "calib.npz"), "--eval",
            str(folder / "eval.npz"), "--evaluate", _command(folder), "--max-rel-loss", "0.5", "--method",
            "minmax", "--repairs", "--max-fallback", "100", "--out", str(out / "mixed.onnx"), "--plan",
            str(out / "plan.json"), "--no-progress"]


def _calls(folder) -> int:
    return len((folder / "calls").read_text()) if (folder / "calls").exists() else 0


def _cli(folder, argv) -> subprocess.CompletedProcess:
    env = {**os.environ, "TMPDIR": str(folder / "tmp")}
    return subprocess.run([sys.executable, "-m", "quantdbg", *argv], env=env, capture_output=True, text=True,
                          timeout=600)


def _stopped_at(folder, argv, call, signum) -> subprocess.CompletedProcess:
    """Runs ``argv`` until its evaluation number ``call`` hangs, then sends ``signum`` to quantdbg."""
    (folder / "pid").unlink(missing_ok=True)
    (folder / "hang").write_text(str(_calls(folder) + call))
    env = {**os.environ, "TMPDIR": str(folder / "tmp")}
    process = subprocess.Popen([sys.executable, "-m", "quantdbg", *argv], env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while not (folder / "pid").exists() or not (folder / "pid").read_text():
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, "the evaluation never started"
        time.sleep(0.05)
    process.send_signal(signum)
    out, err = process.communicate(timeout=120)
    return subprocess.CompletedProcess(process.args, process.returncode, out, err)


def _evaluations(journal) -> int:
    return sum(key.startswith("evaluation:") for key in Journal.read(journal).entries)


@pytest.mark.parametrize(("signum", "status"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_stopped_fallback_resumes_without_evaluating_anything_twice(job, tmp_path_factory, uninterrupted,
                                                                       signum, status):
    parts = tmp_path_factory.mktemp("parts")
    done, total, whole = uninterrupted["fallback"]  # the evaluations of an uninterrupted run (measured)
    assert done.returncode == 0 and total >= 3  # the premise: a stop at the third leaves work to resume
    stopped = _stopped_at(job, _fallback(job, parts), 3, signum)
    assert stopped.returncode == status
    assert stopped.stderr == (f"quantdbg fallback: stopped by {signal.Signals(signum).name}; rerun the same "
                              "command to resume where it stopped.\n")
    journal = parts / "plan.json.partial"
    assert _evaluations(journal) == 2  # the third was running
    rerun = _cli(job, _fallback(job, parts))
    assert rerun.returncode == 0, rerun.stderr
    assert _calls(job) - 3 == total - 2  # only the evaluations not recorded
    assert not journal.exists() and rerun.stdout.splitlines()[0] == done.stdout.splitlines()[0]
    resumed, fresh = FallbackPlan.read(parts / "plan.json"), FallbackPlan.read(whole / "plan.json")
    assert (resumed.exclude, resumed.value, resumed.status) == (fresh.exclude, fresh.value, fresh.status)
    steps = [[(e.exclude, e.value) for e in plan.evaluations] for plan in (resumed, fresh)]
    assert steps[0] == steps[1]


def _same_result(resumed: AutoResult, fresh: AutoResult) -> None:
    keys = ("outcome", "fp32_value", "int8_value", "repaired_value", "final_value", "evaluations")
    assert {k: getattr(resumed, k) for k in keys} == {k: getattr(fresh, k) for k in keys}
    assert resumed.exclude == fresh.exclude and resumed.recipe == fresh.recipe


def test_auto_killed_at_several_points_ends_as_an_uninterrupted_run(job, tmp_path_factory, uninterrupted):
    parts = tmp_path_factory.mktemp("parts")
    done, total, whole = uninterrupted["auto"]
    assert total >= 5  # the premise: the kills below fall on evaluations that exist
    journal = parts / "plan.json.partial"
    for call in (1, 3, 2):  # during the FP32 evaluation (after calibrating), then later ones
        killed = _stopped_at(job, _auto(job, parts), call, signal.SIGKILL)
        assert killed.returncode == -signal.SIGKILL
    assert _evaluations(journal) == 0 + 2 + 1 and _calls(job) == 3 + 3  # three evaluations cut short
    final = _cli(job, _auto(job, parts))
    assert final.returncode == done.returncode, final.stderr
    assert _calls(job) - 6 == total - 3  # each recorded evaluation made once
    assert not journal.exists() and final.stdout.splitlines()[:2] == done.stdout.splitlines()[:2]
    _same_result(AutoResult.read(parts / "plan.json"), AutoResult.read(whole / "plan.json"))


def _main(capsys, argv) -> tuple[int, str]:
    code = main([str(a) for a in argv])
    return code, capsys.readouterr().err


HERE = f"{shlex.quote(sys.executable)} score.py {{model}}"
"""The scoring command, run in the job's folder (so a message names ``score.py``)."""


def _auto_here(*extra) -> list[str]:
    return ["auto", "m.onnx", "--data", "calib.npz", "--eval", "eval.npz", "--evaluate", HERE,
            "--max-rel-loss", "0.5", "--method", "minmax", "--repairs", "--max-fallback", "100", "--out",
            "mixed.onnx", "--plan", "plan.json", "--no-progress", *extra]


def test_a_journal_is_not_resumed_once_the_evaluation_script_or_a_file_it_reads_changed(job, capsys,
                                                                                          monkeypatch):
    monkeypatch.chdir(job)
    argv = _auto_here("--evaluate-deps", "helper.py")
    (job / "fail").write_text("2")  # the run stops after the FP32 evaluation
    code, err = _main(capsys, argv)
    assert code == 2 and "exited with status 1: evaluation failed" in err
    assert _evaluations(job / "plan.json.partial") == 1
    (job / "helper.py").write_text("SCALE = 0.5\n")  # the script now scores half as high
    refused = ("quantdbg auto: error: Resume file 'plan.json.partial' belongs to another run: the evaluation "
               "command's file '{}' changed; pass --restart to start over (or delete the file).\n")
    assert _main(capsys, argv) == (2, refused.format("helper.py"))
    (job / "helper.py").write_text("SCALE = 1.0\n")
    (job / "score.py").write_text(SCORE + "# another version\n")
    assert _main(capsys, argv) == (2, refused.format("score.py"))
    assert _evaluations(job / "plan.json.partial") == 1  # a refused run changes nothing
    (job / "helper.py").write_text("SCALE = 0.5\n")
    before = _calls(job)
    code, err = _main(capsys, [*argv, "--restart"])
    assert code in (0, 1), err
    result = AutoResult.read(job / "plan.json")
    assert result.fp32_value == pytest.approx(0.5)  # the new script's value, not the old one's 1.0
    assert _calls(job) - before == result.n_evaluations and not (job / "plan.json.partial").exists()


def test_evaluate_deps_must_name_files_and_go_with_evaluate(job, capsys, monkeypatch):
    monkeypatch.chdir(job)
    assert _main(capsys, _auto_here("--evaluate-deps", "nope.py")) == (
        2, "quantdbg auto: error: Evaluation dependency 'nope.py' is not an existing file; name each file "
           "the evaluation command reads (--evaluate-deps FILE ...).\n")
    assert _main(capsys, _auto_here("--evaluate-deps", "tmp")) == (
        2, "quantdbg auto: error: Evaluation dependency 'tmp' is a folder; name each file the evaluation "
           "command reads (--evaluate-deps FILE ...).\n")
    code, err = _main(capsys, ["fallback", "q.onnx", "--fp32", "m.onnx", "--eval", "eval.npz",
                               "--max-rel-loss", "1", "--evaluate-deps", "helper.py", "--out", "x.onnx",
                               "--plan", "x.json"])
    assert (code, err) == (2, "quantdbg fallback: error: --evaluate-deps names files the --evaluate command "
                              "reads; add --evaluate CMD.\n")
    assert not (job / "plan.json.partial").exists() and not (job / "x.json.partial").exists()


def test_a_run_that_failed_before_any_evaluation_leaves_no_journal(job, capsys, monkeypatch):
    monkeypatch.chdir(job)
    argv = ["auto", "m.onnx", "--data", "calib.npz", "--eval", "eval.npz", "--max-rel-loss", "50",
            "--method", "minmax", "--repairs", "--out", "mixed.onnx", "--plan", "plan.json"]
    code, err = _main(capsys, [*argv, "--labels", "short"])  # one label short: found at the first evaluation
    assert code == 2 and "the labels have shape" in err
    assert not (job / "plan.json.partial").exists()
    code, err = _main(capsys, [*argv, "--labels", "label"])  # the corrected run is not refused
    assert code == 0, err
    assert AutoResult.read(job / "plan.json").fp32_value == 1.0


def test_analyze_restart_starts_over(job, capsys, monkeypatch):
    monkeypatch.chdir(job)
    argv = ["analyze", "q.onnx", "--fp32", "m.onnx", "--eval", "eval.npz", "--mode", "isolated",
            "--no-evidence", "--evaluate", HERE, "--out", "r.json"]
    (job / "fail").write_text("3")
    assert _main(capsys, argv)[0] == 2
    assert _evaluations(job / "r.json.partial") == 2
    code, err = _main(capsys, [*argv, "--restart"])
    assert code == 0, err
    assert _calls(job) == 3 + 5  # every variant again: the baseline and the four layers
    assert not (job / "r.json.partial").exists()
    (job / "r.json.partial").write_text("my notes\n")  # not a journal: --restart leaves it alone
    assert _main(capsys, [*argv, "--restart"]) == (
        2, "quantdbg analyze: error: Resume file 'r.json.partial' is not a quantdbg journal; choose another "
           "resume file (or delete it if it is one of yours).\n")
    assert (job / "r.json.partial").read_text() == "my notes\n"


@pytest.mark.parametrize("command", ["calibrate", "analyze", "fallback", "auto", "lint", "report", "doctor",
                                     "demo"])
def test_the_stop_message_promises_a_resume_only_where_there_is_one(command):
    line = message(Stopped(signal.SIGINT), command)
    if command in ("analyze", "fallback", "auto"):
        assert line == f"quantdbg {command}: stopped by SIGINT; rerun the same command to resume where it " \
                       "stopped.\n"
    else:
        assert line == f"quantdbg {command}: stopped by SIGINT; rerun the command to start over (it does " \
                       "not resume).\n"
