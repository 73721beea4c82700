"""The grandchildren cases of ``reliability.py``: nothing an evaluation started outlives the run.

The ``--evaluate`` command (``tree.py``) starts a tree of processes and sleeps: a grandchild with a
child of its own, a shell background job (the shell exits at once, orphaning it), and a grandchild
that leaves the process group for a session of its own (``setsid``, as a daemon does). Once every
one of them runs, ``quantdbg`` (analyze, fallback, auto, analyze with ``--jobs 2``) is SIGKILLed,
or stopped with SIGTERM / SIGINT; a process of the tree (or a quantdbg worker it forked) still
running 5 s after quantdbg ended is a survivor, and quantdbg still running 60 s after the signal
(a survivor holding its pipes) is wrong too.
"""
from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

TREE = """import os, subprocess, sys, time
here = os.path.dirname(os.path.abspath(__file__))
roles = ("grandchild", "great-grandchild", "shell-job", "own-session")
role = sys.argv[1] if sys.argv[1] in roles else "child"
open(os.path.join(here, "tree", role + "." + str(os.getpid())), "w").close()
me = [sys.executable, os.path.abspath(__file__)]
if role == "child":
    subprocess.Popen(me + ["grandchild"])
    subprocess.Popen(["sh", "-c", " ".join(me + ["shell-job"]) + " &"])
    subprocess.Popen(me + ["own-session"], start_new_session=True)
elif role == "grandchild":
    subprocess.Popen(me + ["great-grandchild"])
time.sleep(300)
"""
ROLES = ("child", "grandchild", "great-grandchild", "shell-job", "own-session")

EVALUATE = f"{shlex.quote(sys.executable)} tree.py {{model}}"
CASES = [
    ("analyze --mode isolated", signal.SIGKILL,
     ["analyze", "q.onnx", "--fp32", "m.onnx", "--eval", "eval.npz", "--mode", "isolated", "--no-evidence",
      "--evaluate", EVALUATE, "--out", "t.json"]),
    ("analyze --mode isolated --jobs 2", signal.SIGKILL,
     ["analyze", "q.onnx", "--fp32", "m.onnx", "--eval", "eval.npz", "--mode", "isolated", "--no-evidence",
      "--jobs", "2", "--evaluate", EVALUATE, "--out", "t.json"]),
    ("fallback", signal.SIGKILL, ["fallback", "m.onnx", "--data", "calib.npz", "--eval", "eval.npz",
                                  "--evaluate", EVALUATE, "--max-rel-loss", "1", "--out", "t.onnx",
                                  "--plan", "t.json"]),
    ("auto", signal.SIGKILL, ["auto", "m.onnx", "--data", "calib.npz", "--eval", "eval.npz", "--evaluate",
                              EVALUATE, "--max-rel-loss", "1", "--out", "t.onnx", "--plan", "t.json"]),
    ("analyze --mode isolated", signal.SIGTERM,
     ["analyze", "q.onnx", "--fp32", "m.onnx", "--eval", "eval.npz", "--mode", "isolated", "--no-evidence",
      "--evaluate", EVALUATE, "--out", "t.json"]),
    ("analyze --mode isolated", signal.SIGINT,
     ["analyze", "q.onnx", "--fp32", "m.onnx", "--eval", "eval.npz", "--mode", "isolated", "--no-evidence",
      "--evaluate", EVALUATE, "--out", "t.json"]),
]


def run_process_cases(work: Path) -> list[tuple[str, ...]]:
    """One row per case: the processes of the tree left running after the signal."""
    (work / "tree.py").write_text(TREE)
    rows = []
    for what, signum, argv in CASES:
        tree = work / "tree"
        tree.mkdir(exist_ok=True)
        for path in tree.iterdir():
            path.unlink()
        err = work / "tree.err"  # a file, not a pipe: what outlives quantdbg must not hold up the wait
        with err.open("w") as stderr:
            process = subprocess.Popen([sys.executable, "-m", "quantdbg", *argv], cwd=work,
                                       stdout=subprocess.DEVNULL, stderr=stderr, text=True)
        pids = _wait_for_tree(tree, process, err)
        process.send_signal(signum)
        hung = _ends(process, HANG_AFTER)
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline and any(alive(pid) for _, pid in pids):
            time.sleep(0.1)
        left = [(role, pid) for role, pid in pids if alive(pid)] + _workers(work)
        for _, pid in left:
            os.kill(pid, signal.SIGKILL)
        problems = ([f"{len(left)} left running"] if left else []) + (
            [f"quantdbg still running {HANG_AFTER:g} s after the signal"] if hung else [])
        verdict = f"WRONG ACCEPTED ({'; '.join(problems)})" if problems else "ok"
        survivors = ", ".join(sorted(role for role, _ in left)) or "none"
        rows.append(("grandchildren", f"{signal.Signals(signum).name} of {what}", f"all {len(pids)} end",
                     "-" if hung else str(process.returncode), f"left running: {survivors}", "none", verdict))
        for path in work.glob("t.*"):
            path.unlink()
    return rows


HANG_AFTER = 60.0
"""Seconds quantdbg gets to exit after the signal (a process of the tree may hold its pipes)."""


def _ends(process: subprocess.Popen[str], seconds: float) -> bool:
    """Waits for ``process``; True when it was still running after ``seconds`` (then it is killed)."""
    try:
        process.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        return True
    return False


def _wait_for_tree(tree: Path, process: subprocess.Popen[str], err: Path) -> list[tuple[str, int]]:
    """(role, pid) of every process started, once every role of an evaluation's tree runs."""
    while True:
        found = [(name.split(".")[0], int(name.split(".")[1])) for name in os.listdir(tree)]
        if set(ROLES) <= {role for role, _ in found}:
            return found
        if process.poll() is not None:
            raise RuntimeError(f"quantdbg ended before its evaluation started its tree: "
                               f"{err.read_text()[-500:]}")
        time.sleep(0.05)


def _workers(work: Path) -> list[tuple[str, int]]:
    """("quantdbg worker", pid) of each quantdbg process still running in ``work`` (a worker the
    signalled run forked, which could start more evaluations)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            here = os.readlink(entry / "cwd") == str(work)
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except (OSError, ValueError):
            continue
        if here and b"quantdbg" in argv and alive(int(entry.name)):
            found.append(("quantdbg worker", int(entry.name)))
    return found


def alive(pid: int) -> bool:
    """True while ``pid`` runs (a killed process waiting to be reaped, state Z, has stopped)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"
