"""SIGINT/SIGTERM stop a command with one line and 130/143, kill the evaluation command and what it
started, remove the temporary folders; the next run resumes. A SIGKILLed run takes its evaluation
command, and the command's own children, with it."""
from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import tempfile

import models_sensitivity as ms
import numpy as np
import pytest
from processes import LINUX_ONLY, gone, running, wait_for_file

import quantdbg.evaluation.task as task
from quantdbg._journal import Journal
from quantdbg.cli import main
from quantdbg.errors import BackendError, ConfigError
from quantdbg.evaluation import CommandMetric

# Prints a fixed score and counts its calls; the call numbered by the file `hang` (if present)
# starts a child of its own (a grandchild of quantdbg), writes both process ids and hangs, standing
# in for a long evaluation with a data loader's worker.
SCRIPT = """\
import os, subprocess, sys, time
folder = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(folder, "calls"), "a") as f:
    f.write("x")
calls = len(open(os.path.join(folder, "calls")).read())
hang = os.path.join(folder, "hang")
if os.path.exists(hang) and calls == int(open(hang).read()):
    os.remove(hang)
    worker = subprocess.Popen(["sleep", "1000"])
    with open(os.path.join(folder, "pids.tmp"), "w") as f:
        f.write(f"{os.getpid()} {worker.pid}")
    os.rename(os.path.join(folder, "pids.tmp"), os.path.join(folder, "pids"))
    time.sleep(1000)
print(1.0)
"""
FULL_RUN_CALLS = 5  # isolated mode on the four-layer MLP with a command metric


@pytest.fixture
def job(tmp_path):
    np.savez(tmp_path / "eval.npz", x=ms.write_mlp4_pair(tmp_path))
    (tmp_path / "s.py").write_text(SCRIPT)
    (tmp_path / "tmp").mkdir()
    command = f"{shlex.quote(sys.executable)} {shlex.quote(str(tmp_path / 's.py'))} {{model}}"
    argv = [sys.executable, "-m", "quantdbg", "analyze", str(tmp_path / "q.onnx"), "--fp32",
            str(tmp_path / "m.onnx"), "--eval", str(tmp_path / "eval.npz"), "--mode", "isolated",
            "--no-evidence", "--evaluate", command, "--out", str(tmp_path / "r.json")]
    return tmp_path, argv, {**os.environ, "TMPDIR": str(tmp_path / "tmp")}


def _start_hanging(folder, argv, env, call, leftovers):
    """Starts quantdbg and returns it once evaluation number ``call`` hangs, with the ids of the
    evaluation command and of the child it started."""
    (folder / "hang").write_text(str(call))
    process = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    child, grandchild = map(int, wait_for_file(folder / "pids", process).split())
    leftovers += [child, grandchild]
    assert running(child) and running(grandchild)
    return process, child, grandchild


@LINUX_ONLY
@pytest.mark.parametrize(("signum", "status"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_stops_the_run_in_one_line_and_the_next_run_resumes(job, signum, status, leftovers):
    folder, argv, env = job
    process, child, grandchild = _start_hanging(folder, argv, env, 4, leftovers)
    process.send_signal(signum)
    _, err = process.communicate(timeout=60)
    assert process.returncode == status
    assert err == (f"quantdbg analyze: stopped by {signal.Signals(signum).name}; rerun the same command to "
                   "resume where it stopped.\n")
    assert gone(child) and gone(grandchild)
    assert list((folder / "tmp").iterdir()) == []  # no quantdbg-eval-* folder left
    done = Journal.read(folder / "r.json.partial").entries
    assert len(done) >= 1
    (folder / "calls").write_text("")
    rerun = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr
    # A whole run makes 5 evaluations (measured); the rerun makes only those not recorded.
    assert len((folder / "calls").read_text()) == FULL_RUN_CALLS - len(done)
    assert not (folder / "r.json.partial").exists() and (folder / "r.json").is_file()


@LINUX_ONLY
def test_a_killed_run_takes_its_evaluator_along_and_the_next_run_clears_its_folder(job, monkeypatch,
                                                                                   leftovers):
    folder, argv, env = job
    process, child, grandchild = _start_hanging(folder, argv, env, 1, leftovers)
    process.kill()
    process.communicate(timeout=60)
    assert gone(child) and gone(grandchild)
    left = list((folder / "tmp").iterdir())
    assert [p.name.startswith(f"quantdbg-eval-{process.pid}-") for p in left] == [True]
    (folder / "tmp" / "quantdbg-eval-1-keep").mkdir()  # pid 1 runs: its folder stays
    monkeypatch.setattr(tempfile, "tempdir", str(folder / "tmp"))
    task._remove_stale_folders.__wrapped__()
    assert [p.name for p in (folder / "tmp").iterdir()] == ["quantdbg-eval-1-keep"]


def test_a_non_executable_evaluate_file_is_refused_up_front(tmp_path):
    script = tmp_path / "eval.sh"
    script.write_text("#!/bin/sh\necho 1\n")
    script.chmod(0o644)
    with pytest.raises(ConfigError, match=r"^Evaluation command '.*eval\.sh \{model\}': '.*eval\.sh' is not "
                                          r"an executable file; make it executable \(chmod \+x\)"):
        CommandMetric(f"{script} {{model}}")
    metric = CommandMetric("eval.sh {model}", cwd=tmp_path)  # found on PATH, checked when it runs
    with pytest.raises(BackendError, match=r"program 'eval\.sh' not found"):
        metric.from_model(tmp_path / "m.onnx")


def test_evaluate_with_a_mode_that_never_calls_it_is_refused(job, capsys):
    folder, argv, _ = job
    local = argv[3:]
    local[local.index("isolated")] = "local"
    assert main(local) == 2
    assert capsys.readouterr().err == ("quantdbg analyze: error: --evaluate scores whole model variants, "
                                       "which --mode local does not make (it ranks layers by output error); "
                                       "add --mode isolated or --mode leave-one-out.\n")
    assert not (folder / "r.json").exists()


def test_labels_with_local_mode_score_its_output_space_ranking(job):
    """--labels is used by local mode (its output-space ranking scores accuracy), so it is accepted."""
    import json

    folder, argv, _ = job
    with np.load(folder / "eval.npz") as evals:
        x = evals["x"]
    np.savez(folder / "eval.npz", x=x, labels=np.arange(len(x)) % 4)
    local = argv[3:argv.index("--evaluate")] + ["--out", str(folder / "r.json"), "--no-progress"]
    local[local.index("isolated")] = "local"
    assert main([*local, "--labels", "labels"]) == 0
    assert "accuracy" in json.loads((folder / "r.json").read_text())["output_space"]["metric"]
