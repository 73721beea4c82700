"""The reliability cases about outputs (see ``reliability.py``): outputs aimed at files a command reads
or writes (a model's external data file, the ``--evaluate`` script, ``OUT.onnx.data``, the demo's
files), two runs on one output, and a disk that fills (ENOSPC at the n-th write) or turns
read-only (EROFS) mid-run. Each case says what a correct run does (refuse / run); a verdict counts
tracebacks, inputs changed and wrong results accepted (a refused request run, a model that does
not load, a half set of outputs left).

The runner ``cli(work, command) -> (exit status, last stderr line)`` (-1: an exception escaped)
and ``state(work) -> {file name: SHA-256}`` come from ``reliability.py``.
"""
from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

Cli = Callable[[Path, str], tuple[int, str]]
State = Callable[[Path], dict[str, str]]

SCORE = "print(1.0)\n"
HOLD = """import os, time
here = os.path.dirname(os.path.abspath(__file__))
if not os.path.exists(os.path.join(here, "held")):
    open(os.path.join(here, "held"), "w").write(str(os.getppid()))
    while os.path.exists(os.path.join(here, "hold")):
        time.sleep(0.05)
print(1.0)
"""


def path_inputs(work: Path, cli: Cli) -> None:
    """``model_fp32.onnx`` with its weights in ``model.onnx.data``, its Q/DQ form with its data file,
    a scoring script, and a report.html and the demo's data names the user already had."""
    import onnx

    onnx.save_model(onnx.load(str(work / "m.onnx")), str(work / "model_fp32.onnx"),
                    save_as_external_data=True, location="model.onnx.data", size_threshold=256)
    assert cli(work, "calibrate model_fp32.onnx --data calib.npz --method minmax --out qx.onnx")[0] == 0
    (work / "score.py").write_text(SCORE)
    (work / "report.html").write_text("<p>last week's report</p>\n")
    (work / "hold.py").write_text(HOLD)


FP32 = "model_fp32.onnx --data calib.npz"
PATH_CASES = [
    ("calibrate --out X: X.data is MODEL's data", f"calibrate {FP32} --out model.onnx"),
    ("calibrate --cache MODEL's data", f"calibrate {FP32} --out x.onnx --cache model.onnx.data"),
    ("analyze --out MODEL's data", f"analyze {FP32} --eval eval.npz --out model.onnx.data"),
    ("fallback --plan MODEL's data", f"fallback {FP32} --eval eval.npz --min-metric 0 --metric cosine "
                                     "--out x.onnx --plan model.onnx.data"),
    ("doctor --md MODEL's data", f"doctor {FP32} --checks weight_zeroing --md model.onnx.data"),
    ("lint --json MODEL's data", "lint qx.onnx --json qx.onnx.data"),
    ("calibrate --cache X.data of --out X", f"calibrate {FP32} --out q2.onnx --cache q2.onnx.data"),
    ("auto --html the --evaluate script", f"auto m.onnx --data calib.npz --eval eval.npz --evaluate "
                                          f"'{sys.executable} score.py {{model}}' --max-rel-loss 1 "
                                          "--out x.onnx --plan p.json --html score.py"),
    ("demo --export over the user's files", "demo --export ."),
    ("demo --out over the user's report", "demo --out ."),
]


def _loads(path: Path) -> bool:
    from quantdbg.model import load_model

    try:
        load_model(str(path), allow_quantized=True)
    except Exception:  # noqa: BLE001 - a model that does not load is what this counts
        return False
    return True


def run_path_cases(work: Path, cli: Cli, state: State) -> list[tuple[str, ...]]:
    """Every case asks for an output on a file the command reads or writes: it must be refused."""
    rows = []
    pristine = {p.name: p.read_bytes() for p in work.iterdir() if p.is_file() and not p.is_symlink()}
    for case, command in PATH_CASES:
        before = state(work)
        status, line = cli(work, command)
        after = state(work)
        changed = sorted(n for n in before if after.get(n) != before[n])
        broken = [n for n in sorted(set(after) - set(before)) if n.endswith(".onnx") and not _loads(work / n)]
        rows.append(("paths", case, "refused", str(status), _short(line, work), ", ".join(changed) or "none",
                     _verdict(status, changed, _accepted(status) or bool(broken),
                              f"broken {', '.join(broken)}" if broken else "")))
        for name in set(after) - set(before):
            (work / name).unlink()
        for name in (n for n in changed if n in pristine):
            (work / name).write_bytes(pristine[name])
    return rows


def _short(line: str, work: Path) -> str:
    return line.replace("|", "\\|").replace(str(work) + "/", "")[:160]


def _accepted(status: int) -> bool:
    """The command went ahead (0, or 1: a target missed, a finding) where it should have refused (2)."""
    return status not in (2, -1)


def _verdict(status: int, changed: list[str], wrong: bool, detail: str = "") -> str:
    words = (["TRACEBACK"] if status == -1 else []) + (["INPUT CHANGED"] if changed else []) + \
        (["WRONG ACCEPTED" + (f" ({detail})" if detail else "")] if wrong else [])
    return ", ".join(words) or "ok"


def run_concurrent_cases(work: Path, cli: Cli) -> list[tuple[str, ...]]:
    """A first run sits in its evaluation; a second run on one of its outputs must be refused, and a
    third, once the first was SIGKILLed, must run."""
    evaluate = f"'{sys.executable} hold.py {{model}}'"
    cases = [("analyze, same --out", f"analyze q.onnx --fp32 m.onnx --eval eval.npz --mode isolated "
                                      f"--no-evidence --evaluate {evaluate} --out same.json"),
             ("auto, same --plan (journal)", f"auto m.onnx --data calib.npz --eval eval.npz --evaluate "
                                             f"{evaluate} --max-rel-loss 1 --out same.onnx "
                                             "--plan same_plan.json")]
    rows = []
    for case, command in cases:
        for name in ("held", "hold"):
            (work / name).unlink(missing_ok=True)
        (work / "hold").write_text("")
        first = subprocess.Popen([sys.executable, "-m", "quantdbg", *shlex.split(command)], cwd=work,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        while not (work / "held").exists() and first.poll() is None:
            time.sleep(0.05)
        status, line = cli(work, command)
        rows.append(("concurrent", case + ", while the first runs", "refused", str(status),
                     _short(line, work), "none", _verdict(status, [], _accepted(status))))
        first.kill()
        first.communicate()
        (work / "hold").unlink()
        status, line = cli(work, command)
        rows.append(("concurrent", case + ", first SIGKILLed", "runs", str(status), _short(line, work),
                     "none", _verdict(status, [], False) if status in (0, 1) else "WRONGLY REFUSED"))
        for path in work.iterdir():
            if path.name.startswith(("same", ".same", "held")) and path.is_file():
                path.unlink()
    return rows


def run_disk_cases(work: Path, cli: Cli, state: State) -> list[tuple[str, ...]]:
    """The n-th file a command writes fails with ENOSPC, or the output folder turns read-only (EROFS)
    once the command started: one line, and no output set left half written."""
    out = work / "out"
    sets = {
        "lint --json --md": ("lint q.onnx --json out/l.json --md out/l.md", ["l.json", "l.md"]),
        "report --html --md": ("report r.json --html out/r.html --md out/r.md --no-plots",
                               ["r.md", "r.html"]),
        "doctor --json --md --html": ("doctor m.onnx --data calib.npz --checks weight_zeroing --json "
                                      "out/d.json --md out/d.md --html out/d.html",
                                      ["d.json", "d.md", "d.html"]),
        "demo --export": ("demo --export out", ["model.onnx", "calib.npz", "eval.npz", "score.py"]),
        "auto (journal, outputs)": ("auto m.onnx --data calib.npz --eval eval.npz --metric cosine "
                                    "--min-metric 1.01 --out out/a.onnx --plan out/a.json",
                                    ["a.onnx", "a.json"]),
    }
    rows = []
    for what, (command, names) in sets.items():
        for fault, n in [("ENOSPC", k) for k in range(1, 6)] + [("EROFS", 0)]:
            shutil.rmtree(out, ignore_errors=True)
            out.mkdir()
            before, calls = state(work), []
            with _fault(fault, n, out, calls):
                status, line = cli(work, command)
            if fault == "ENOSPC" and len(calls) < n:
                continue  # the command writes fewer times: no fault was injected
            left = sorted(p.name for p in out.iterdir() if p.name in names)
            changed = sorted(k for k, v in state(work).items() if before.get(k) != v)
            case = f"{what}: {fault}" + (f" at write {n}" if n else "")
            half = f"half set left: {', '.join(left)}" if left else ""
            verdict = _verdict(status, changed, _accepted(status) or bool(left), half)
            rows.append(("disk", case, "one line, no half set", str(status), _short(line, work),
                         ", ".join(changed) or "none", verdict))
    shutil.rmtree(out, ignore_errors=True)
    return rows


@contextlib.contextmanager
def _fault(kind: str, n: int, out: Path, calls: list[Any]) -> Iterator[None]:
    """ENOSPC at the n-th write into ``out`` (a file published through ``_io.publish``, where every
    quantdbg output goes, or an ``os.write`` to a file there: the resume journal, a lock; each is
    appended to ``calls``), or EROFS for files created in ``out``."""
    import quantdbg._io as io_

    saved = {"publish": io_.publish, "write": os.write, "mkstemp": tempfile.mkstemp,
             "mkdtemp": tempfile.mkdtemp}

    def full() -> None:
        calls.append(None)
        if len(calls) == n:
            raise OSError(28, "No space left on device")

    def publish(tmp: Any, dest: Any) -> None:
        full()
        saved["publish"](tmp, dest)

    def write(fd: int, data: Any) -> int:
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # not a file (a closed descriptor): not counted
            target = ""
        if target.startswith(str(out.resolve()) + os.sep):
            full()
        return saved["write"](fd, data)

    def read_only(name: str) -> Callable[..., Any]:
        def create(*args: Any, **kwargs: Any) -> Any:
            folder = kwargs.get("dir")
            if folder is not None and Path(folder).resolve() == out.resolve():
                raise OSError(30, "Read-only file system", str(folder))
            return saved[name](*args, **kwargs)
        return create

    if kind == "ENOSPC":
        io_.publish, os.write = publish, write
    else:
        tempfile.mkstemp, tempfile.mkdtemp = read_only("mkstemp"), read_only("mkdtemp")
    try:
        yield
    finally:
        io_.publish, os.write = saved["publish"], saved["write"]
        tempfile.mkstemp, tempfile.mkdtemp = saved["mkstemp"], saved["mkdtemp"]


def summary(rows: list[tuple[str, ...]]) -> list[tuple[str, ...]]:
    """Per category: cases tried, tracebacks, inputs changed, wrong results accepted, wrongly refused
    (rows marked ``n/a`` or ``not counted`` left out)."""
    found = []
    for category in dict.fromkeys(r[0] for r in rows):
        mine = [r[-1] for r in rows if r[0] == category and not r[-1].startswith(("n/a", "not counted"))]
        found.append((category, str(len(mine)), *(str(sum(word in v for v in mine)) for word in
                                                    ("TRACEBACK", "INPUT CHANGED", "WRONG ACCEPTED",
                                                     "WRONGLY REFUSED"))))
    return found
