"""The stale-resume cases of ``reliability.py``: a resumed run never reuses a value its inputs no longer give.

``analyze``, ``fallback`` and ``auto`` run with an ``--evaluate`` command and are SIGKILLed while
their third evaluation runs (two are journaled). Then one thing changes -- nothing (the control), the
evaluation script (same command line), a file the command names, a dependency listed with
``--evaluate-deps``, the evaluation or calibration data, the model, or the journal's values edited by
hand -- and the same command runs again. Its result is compared with a fresh run's on the changed
inputs (no journal): a rerun that exits 0 or 1 with another result accepted a stale value. A rerun
refused in one line (exit 2) is right; the control must resume (fewer evaluations than the fresh run)
and give the fresh run's result.

The runner ``run(work, argv) -> (exit status, last stderr line, stdout)`` comes from ``reliability.py``.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

Run = Callable[[Path, list[str]], tuple[int, str, str]]

STOP_AFTER = 2
"""Evaluations done before the run is killed (the next one waits to be killed)."""

SCORE = """import os, sys, time, zlib
import resume_helper
VERSION = 1.0
here = os.path.dirname(os.path.abspath(__file__))
raw = open(sys.argv[1], "rb").read()
factor = float(open(sys.argv[2]).read())
data = open(os.path.join(here, "eval.npz"), "rb").read()
with open(os.path.join(here, "calls"), "a") as log:
    log.write("1\\n")
if os.path.exists(os.path.join(here, "hold")) and len(open(os.path.join(here, "calls")).readlines()) > {k}:
    open(os.path.join(here, "held"), "w").write(str(os.getpid()))
    time.sleep(600)
noise = (zlib.crc32(raw) % 997 + zlib.crc32(data) % 991) * 1e-7
print(VERSION * factor * resume_helper.SCALE * (1 - 0.003 * raw.count(b"DequantizeLinear")) + noise)
""".replace("{k}", str(STOP_AFTER))
"""The metric: lower the more Q/DQ pairs the model holds; it reads its version, the file the command
names (``factor.txt``), a module it imports (``resume_helper.py``), the model's bytes and the
evaluation data, so a change to any of them changes every value."""

EVALUATE = f"{sys.executable} resume_score.py {{model}} factor.txt"
COMMANDS = {
    "analyze": ["analyze", "m.onnx", "--data", "calib.npz", "--eval", "eval.npz", "--mode", "isolated",
                "--no-evidence", "--evaluate", EVALUATE, "--out", "ra.json"],
    "fallback": ["fallback", "m.onnx", "--data", "calib.npz", "--eval", "eval.npz", "--evaluate", EVALUATE,
                 "--max-rel-loss", "2", "--out", "rf.onnx", "--plan", "rf.json"],
    "auto": ["auto", "m.onnx", "--data", "calib.npz", "--eval", "eval.npz", "--evaluate", EVALUATE,
             "--max-rel-loss", "2", "--out", "ru.onnx", "--plan", "ru.json"],
}
RESULT = {"analyze": "ra.json", "fallback": "rf.json", "auto": "ru.json"}
DEPS = ["--evaluate-deps", "resume_helper.py"]


def _edit_script(work: Path) -> None:
    path = work / "resume_score.py"
    path.write_text(path.read_text().replace("VERSION = 1.0", "VERSION = 0.5"))


def _edit_helper(work: Path) -> None:
    (work / "resume_helper.py").write_text("SCALE = 0.7\n")


def _edit_array(work: Path, name: str) -> None:
    with np.load(work / name) as found:
        arrays = {key: found[key] for key in found.files}
    key = next(k for k, v in arrays.items() if v.dtype.kind == "f")
    arrays[key] = arrays[key][::-1].copy()  # the same samples in another order
    arrays[key][0] *= 1.5
    np.savez(work / name, **arrays)


def _edit_model(work: Path) -> None:
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(work / "m.onnx"))
    weight = next(w for w in model.graph.initializer if numpy_helper.to_array(w).ndim == 4)
    weight.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(weight) * 1.5, weight.name))
    onnx.save(model, str(work / "m.onnx"))


def _zero_values(work: Path, journal: Path | None, only_one: bool = False) -> None:
    """Sets the floats of the journal (every JSON line, or the whole file) to 0, or only the first."""
    if journal is None:
        return
    left = [1 if only_one else -1]

    def zero(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: zero(v) for k, v in value.items()}
        if isinstance(value, list):
            return [zero(v) for v in value]
        if isinstance(value, float) and left[0] != 0:
            left[0] -= 1
            return 0.0
        return value

    text = journal.read_text()
    try:
        journal.write_text(json.dumps(zero(json.loads(text))))
    except json.JSONDecodeError:
        lines = [json.dumps(zero(json.loads(line))) if line.strip() else line for line in text.splitlines()]
        journal.write_text("\n".join(lines) + "\n")


Change = Callable[[Path, "Path | None"], None]
CONTROL = "nothing changed (control: resumes)"
CASES: list[tuple[str, Change, bool, bool]] = [
    (CONTROL, lambda w, j: None, False, False),
    ("evaluation script edited, same command line", lambda w, j: _edit_script(w), False, True),
    ("file named in the command edited", lambda w, j: (w / "factor.txt").write_text("0.8\n"), False, True),
    ("--evaluate-deps module edited", lambda w, j: _edit_helper(w), True, True),
    ("evaluation data edited (same path)", lambda w, j: _edit_array(w, "eval.npz"), False, True),
    ("calibration data edited (same path)", lambda w, j: _edit_array(w, "calib.npz"), False, True),
    ("model edited (one weight x1.5)", lambda w, j: _edit_model(w), False, True),
    ("journal: every value set to 0 by hand", lambda w, j: _zero_values(w, j), False, False),
    ("journal: one value set to 0 by hand", lambda w, j: _zero_values(w, j, only_one=True), False, False),
]
"""(case, the change made between the killed run and the rerun, whether the command needs
--evaluate-deps, whether an input changed)."""

UNLISTED = "module the script imports edited, not listed in --evaluate-deps"
"""The documented limit: quantdbg cannot know what a script imports unless it is told (not counted)."""


def resume_inputs(work: Path) -> None:
    (work / "resume_score.py").write_text(SCORE)
    (work / "resume_helper.py").write_text("SCALE = 1.0\n")
    (work / "factor.txt").write_text("1.0\n")


def run_resume_cases(work: Path, run: Run) -> list[tuple[str, ...]]:
    """One row per command and case (the documented limit last)."""
    deps_known = "--evaluate-deps" in run(work, ["fallback", "--help"])[2]
    pristine = {p.name: p.read_bytes() for p in work.iterdir() if p.is_file() and not p.is_symlink()}
    rows: list[tuple[str, ...]] = []
    for command, argv in COMMANDS.items():
        baseline: dict[tuple[str, ...], tuple[Any, int]] = {}
        for case, change, deps, changes in [*CASES, (UNLISTED, lambda w, j: _edit_helper(w), False, True)]:
            if deps and not deps_known:
                rows.append(("resume", f"{command}: {case}", "-", "n/a", "--evaluate-deps does not exist",
                             "-", "n/a"))
                continue
            full = argv + (DEPS if deps else [])
            rows.append(_case(work, run, (command, case), full, change, None if changes else baseline))
            for path in work.iterdir():  # inputs restored, outputs and journals removed
                if path.is_file() and path.name not in pristine:
                    path.unlink()
                elif path.is_file() and path.read_bytes() != pristine[path.name]:
                    path.write_bytes(pristine[path.name])
    return rows


def _case(work: Path, run: Run, what: tuple[str, str], argv: list[str], change: Change,
          baseline: dict[tuple[str, ...], tuple[Any, int]] | None) -> tuple[str, ...]:
    """Stop, change, rerun; compare with a fresh run (``baseline`` caches it when no input changed)."""
    command, case = what
    result = work / RESULT[command]
    _stop_after_evaluations(work, argv)
    journal = work / f"{RESULT[command]}.partial"
    change(work, journal if journal.exists() else None)
    (work / "calls").unlink(missing_ok=True)
    status, line, _ = run(work, argv)
    rerun, got = _calls(work), _result(result)
    _remove(work, result)
    expected = "resumes, same result" if case == CONTROL else "refused, or the fresh result"
    if case == UNLISTED:
        expected = "documented limit, not counted"
    if status not in (0, 1):
        verdict = "TRACEBACK" if status == -1 else ("WRONGLY REFUSED" if case == CONTROL else "ok")
        verdict = f"not counted: {verdict}" if case == UNLISTED else verdict
        return ("resume", f"{command}: {case}", expected, str(status), _short(line, work), "refused", verdict)
    if baseline is None or tuple(argv) not in baseline:
        found = _fresh(work, run, argv, result)
        if baseline is not None:
            baseline[tuple(argv)] = found
    else:
        found = baseline[tuple(argv)]
    want, fresh = found
    verdict = "ok"
    if got != want:
        verdict = "stale value used"
    elif case == CONTROL and rerun >= fresh:
        verdict = "did not resume"
    if case == UNLISTED:
        verdict = f"not counted: {verdict}"
    elif verdict != "ok":
        verdict = f"WRONG ACCEPTED ({verdict})"
    return ("resume", f"{command}: {case}", expected, str(status), _short(line, work),
            f"{rerun} evaluation(s) on rerun, {fresh} fresh", verdict)


def _stop_after_evaluations(work: Path, argv: list[str]) -> None:
    """Runs ``quantdbg ARGV`` until it sits in its evaluation number STOP_AFTER + 1, then SIGKILLs it."""
    for name in ("calls", "held"):
        (work / name).unlink(missing_ok=True)
    (work / "hold").write_text("")
    process = subprocess.Popen([sys.executable, "-m", "quantdbg", *argv], cwd=work, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True)
    while not (work / "held").exists() and process.poll() is None:
        time.sleep(0.05)
    if process.poll() is not None:
        raise RuntimeError(f"{shlex.join(argv)} ended before its evaluation {STOP_AFTER + 1}: "
                           f"{process.communicate()[1][-500:]}")
    process.kill()
    process.communicate()
    time.sleep(0.5)
    _kill(int((work / "held").read_text() or 0))  # where the evaluation outlives its caller
    (work / "hold").unlink()


def _kill(pid: int) -> None:
    if pid:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _fresh(work: Path, run: Run, argv: list[str], result: Path) -> tuple[Any, int]:
    """The result and evaluation count of a run with no journal."""
    _remove(work, result)
    (work / "calls").unlink(missing_ok=True)
    status, line, _ = run(work, argv)
    if status not in (0, 1):
        raise RuntimeError(f"fresh run of {shlex.join(argv)} failed ({status}): {line}")
    found = _result(result), _calls(work)
    _remove(work, result)
    return found


def _remove(work: Path, result: Path) -> None:
    for path in (result, Path(f"{result}.partial")):
        path.unlink(missing_ok=True)


def _calls(work: Path) -> int:
    path = work / "calls"
    return len(path.read_text().splitlines()) if path.exists() else 0


_VOLATILE = re.compile(r"footprint|seconds|elapsed|time|rss|duration")


def _result(path: Path) -> Any:
    """The result document without what differs between two identical runs (timings, memory)."""
    def strip(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: strip(v) for k, v in value.items() if not _VOLATILE.search(k)}
        if isinstance(value, list):
            return [strip(v) for v in value]
        return value

    return strip(json.loads(path.read_text())) if path.exists() else None


def _short(line: str, work: Path) -> str:
    return line.replace("|", "\\|").replace(str(work) + "/", "")[:200]
