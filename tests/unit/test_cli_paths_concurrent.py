"""Two runs writing one output at once: the second is refused in one line naming the lock file and
the first run's process id; the lock goes with the first run however it ends (SIGKILL too)."""
from __future__ import annotations

import errno
import os
import shlex
import signal
import subprocess
import sys
import textwrap
import time

import models_sensitivity as ms
import numpy as np
import pytest

from quantdbg._io import output_lock
from quantdbg.cli import main
from quantdbg.errors import ConfigError, OutputError

# Scores 1.0. The first call (of the first run) writes its pid to `pid` and waits while the file
# `hold` exists: that run sits inside its evaluation, lock held, until the test lets it go; later
# calls (another run's) score at once.
HOLD = textwrap.dedent("""\
    import os, sys, time
    here = os.path.dirname(os.path.abspath(__file__))
    if not os.path.exists(os.path.join(here, "pid")):
        open(os.path.join(here, "pid"), "w").write(str(os.getpid()))
        while os.path.exists(os.path.join(here, "hold")):
            time.sleep(0.05)
    print(1.0)
    """)


@pytest.fixture()
def folder(tmp_path):
    x = ms.write_mlp4_pair(tmp_path)
    np.savez(tmp_path / "eval.npz", x=x)
    (tmp_path / "hold.py").write_text(HOLD)
    return tmp_path


def _wait_for(path, process, timeout=120.0):
    deadline = time.monotonic() + timeout
    while not (path.exists() and path.read_text()):
        if process.poll() is not None:
            raise AssertionError(f"the first run ended early: {process.communicate()}")
        assert time.monotonic() < deadline, "the first run never reached its evaluation"
        time.sleep(0.05)


def _busy(path, pid):
    lock = os.path.join(os.path.dirname(os.path.realpath(path)), f".{os.path.basename(path)}.lock")
    return (f"--out {str(path)!r} is being written by another quantdbg run (pid {pid}, lock file {lock!r}); "
            "wait for it to end, or choose another output path.")


def test_a_second_run_on_the_same_output_is_refused_until_the_first_dies(folder, capsys, monkeypatch):
    command = f"{shlex.quote(sys.executable)} {shlex.quote(str(folder / 'hold.py'))} {{model}}"
    argv = ["analyze", "q.onnx", "--fp32", "m.onnx", "--eval", "eval.npz", "--mode", "isolated",
            "--no-evidence", "--evaluate", command, "--out", "r.json"]
    monkeypatch.chdir(folder)
    (folder / "hold").write_text("")
    first = subprocess.Popen([sys.executable, "-m", "quantdbg", *argv], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE)
    try:
        _wait_for(folder / "pid", first)
        assert main(argv) == 2
        assert capsys.readouterr().err == f"quantdbg analyze: error: {_busy('r.json', first.pid)}\n"
        absolute = str(folder / "r.json")  # another spelling of the same file takes the same lock
        assert main([*argv[:-1], absolute]) == 2
        assert capsys.readouterr().err == f"quantdbg analyze: error: {_busy(absolute, first.pid)}\n"
    finally:
        first.kill()  # SIGKILL: no handler runs; the kernel releases the lock
        first.communicate()
    assert first.returncode == -signal.SIGKILL
    (folder / "hold").unlink()
    assert main(argv) == 0  # the lock died with its run: this run resumes the sweep and finishes
    assert (folder / "r.json").is_file() and not (folder / ".r.json.lock").exists()


def test_the_lock_names_its_holder_and_goes_with_the_block(tmp_path):
    out = tmp_path / "plan.json"
    with output_lock(out, "--plan 'plan.json'") as lock:
        assert lock == tmp_path.resolve() / ".plan.json.lock"
        assert lock.read_text() == f"{os.getpid()}\n"
        busy = rf"^--plan 'plan.json' is being written by another quantdbg run \(pid {os.getpid()}, lock "
        with pytest.raises(ConfigError, match=busy + r"file '.*\.plan\.json\.lock'\)"):
            with output_lock(tmp_path / "." / "plan.json", "--plan 'plan.json'"):
                pass
    assert list(tmp_path.iterdir()) == []
    with output_lock(out, "--plan 'plan.json'"):  # free again
        pass


def test_a_lock_file_the_full_disk_refuses_is_one_output_error(tmp_path, monkeypatch):
    real = os.write

    def full(fd, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "write", full)
    with pytest.raises(OutputError) as failed:
        with output_lock(tmp_path / "p.json", "--plan 'p.json'"):
            pass
    monkeypatch.setattr(os, "write", real)
    lock = tmp_path.resolve() / ".p.json.lock"
    assert str(failed.value) == f"Cannot write {str(lock)!r}: No space left on device; nothing was written."
    assert failed.value.errno == errno.ENOSPC and list(tmp_path.iterdir()) == []
