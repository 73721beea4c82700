"""Red-team run of the command line and the readers, as a hostile user would try them.

Every case runs a `quantdbg` command on the embedded digits CNN in a scratch folder and records the
exit status, the first line of stderr, whether any input's SHA-256 changed and which files
appeared. Then each reader gets N randomly mutated documents (a value replaced, a key dropped, the
text cut short) and the model loader N randomly mutated protobufs; anything but the library's own
errors counts as an escape. Then outputs aimed at files a command reads or writes (a model's
external data file, the --evaluate script, ``OUT.onnx.data``, the demo's files), two runs on one
output, a disk that fills (ENOSPC at the n-th file) or turns read-only (EROFS) mid-run, hostile
node names and paths in the generated build commands (``_reliability_names.py``), a resume after
an input or the journal changed (``_reliability_resume.py``) and what an ``--evaluate`` command
started, after a signal (``_reliability_processes.py``), each counted as tried / tracebacks /
inputs changed / wrong results accepted. Prints Markdown tables (the Reliability section of
RESULTS.md)::

    python benchmarks/reliability.py --mutations 1000 > /tmp/reliability.md
    python benchmarks/reliability.py --categories paths concurrent disk names resume grandchildren
"""
from __future__ import annotations

import argparse
import contextlib
import functools
import hashlib
import io
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
import _reliability_names as names  # noqa: E402
import _reliability_outputs as outputs  # noqa: E402
import _reliability_processes as processes  # noqa: E402
import _reliability_resume as resume  # noqa: E402
from json_docs import json_paths  # noqa: E402

from quantdbg.cli import main
from quantdbg.demo import INPUT_NAME, load_embedded
from quantdbg.errors import QuantDbgError

HANG = """import os, sys, time
open(os.path.join(os.path.dirname(__file__), "pid"), "w").write(str(os.getpid()))
time.sleep(300)
"""


def _setup(work: Path) -> None:
    emb = load_embedded()
    shutil.copy(emb.model_path, work / "m.onnx")
    np.savez(work / "calib.npz", **{INPUT_NAME: emb.calib[INPUT_NAME][:64]})
    np.savez(work / "eval.npz", **{INPUT_NAME: emb.eval_inputs[INPUT_NAME][:64]}, label=emb.labels[:64])
    (work / "hang.py").write_text(HANG)
    assert _cli(work, "calibrate m.onnx --data calib.npz --method minmax --out q.onnx")[0] == 0
    assert _cli(work, "analyze q.onnx --fp32 m.onnx --eval eval.npz --no-evidence --out r.json")[0] == 0


def _state(work: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(work.iterdir()) if p.is_file()}


def _cli(work: Path, command: str) -> tuple[int, str]:
    return _run(work, shlex.split(command))[:2]


def _run(work: Path, argv: list[str]) -> tuple[int, str, str]:
    """Runs ``quantdbg ARGV`` in ``work``: exit status (-1: an exception escaped), last stderr line and
    stdout."""
    err, out = io.StringIO(), io.StringIO()
    cwd = os.getcwd()
    os.chdir(work)
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                status = main(argv + (["--no-progress"] if "--no-progress" not in argv
                                      and argv[0] in ("calibrate", "doctor") else []))
            except BaseException as exc:  # noqa: BLE001 - an escape is what this script measures
                return -1, f"ESCAPED {type(exc).__name__}: {exc}", out.getvalue()
    finally:
        os.chdir(cwd)
    lines = err.getvalue().strip().splitlines()
    return status, lines[-1] if lines else "", out.getvalue()


CLI_CASES = [
    ("1", "analyze --out MODEL", "analyze m.onnx --data calib.npz --eval eval.npz --out m.onnx"),
    ("1", "fallback --plan MODEL", "fallback q.onnx --fp32 m.onnx --eval eval.npz --min-sqnr 30 --out x.onnx "
                                   "--plan q.onnx"),
    ("1", "fallback --plan == --report", "fallback q.onnx --fp32 m.onnx --eval eval.npz --min-sqnr 30 "
                                         "--out x.onnx --plan r.json --report r.json"),
    ("1", "fallback --out X --plan X", "fallback q.onnx --fp32 m.onnx --eval eval.npz --min-sqnr 30 "
                                       "--out x.onnx --plan x.onnx"),
    ("1", "lint --json MODEL", "lint q.onnx --json q.onnx"),
    ("1", "doctor --json MODEL", "doctor m.onnx --data calib.npz --json m.onnx"),
    ("1", "report --md RESULT", "report r.json --md r.json"),
    ("1", "calibrate --out == --data", "calibrate m.onnx --data calib.npz --out calib.npz"),
    ("1", "calibrate --out X --cache X", "calibrate m.onnx --data calib.npz --out x.onnx --cache x.onnx"),
    ("1", "MODEL through a symlink", "calibrate link.onnx --data calib.npz --out m.onnx"),
    ("5", "empty .npz file", "calibrate m.onnx --data empty.npz --out x.onnx"),
    ("5", ".npy given as --data", "calibrate m.onnx --data one.npy --out x.onnx"),
    ("5", ".npz declaring 238 GiB", "calibrate m.onnx --data forged.npz --out x.onnx"),
    ("5", "--labels on an object array", "analyze q.onnx --fp32 m.onnx --eval objects.npz --labels label "
                                         "--mode isolated --out x.json"),
    ("8", "empty eval file", "analyze m.onnx --data calib.npz --eval nosamples.npz --out x.json"),
    ("6", "--out is a folder", "calibrate m.onnx --data calib.npz --out sub"),
    ("6", "--out folder missing", "calibrate m.onnx --data calib.npz --out nope/x.onnx"),
    ("8", "--evaluate with --mode local", f"analyze q.onnx --fp32 m.onnx --eval eval.npz --evaluate "
                                          f"'{sys.executable} hang.py {{model}}' --out x.json"),
    ("8", "--evaluate not executable", "analyze q.onnx --fp32 m.onnx --eval eval.npz --mode isolated "
                                       "--evaluate './noexec.py {model}' --out x.json"),
    ("4", "model: node name not UTF-8", "lint badutf8.onnx"),
    ("3", "resume file holds `1`", "analyze q.onnx --fp32 m.onnx --eval eval.npz --mode isolated "
                                   "--out one.json"),
]


def _bad_inputs(work: Path) -> None:
    (work / "link.onnx").symlink_to(work / "m.onnx")
    (work / "empty.npz").write_bytes(b"")
    np.save(work / "one.npy", np.zeros(3))
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": "<f4", "fortran_order": False,
                                                  "shape": (4_000_000_000, 16)})
    import zipfile
    with zipfile.ZipFile(work / "forged.npz", "w") as archive:
        archive.writestr(f"{INPUT_NAME}.npy", header.getvalue() + bytes(64))
    np.savez(work / "objects.npz", **{INPUT_NAME: load_embedded().eval_inputs[INPUT_NAME][:4]},
             label=np.array([object()] * 4, dtype=object))
    np.savez(work / "nosamples.npz", **{INPUT_NAME: np.zeros((0, 1, 16, 16), np.float32)})
    (work / "sub").mkdir()
    (work / "noexec.py").write_text("print(1)\n")
    raw = (work / "m.onnx").read_bytes()
    name = next(n.name for n in __import__("onnx").load(str(work / "m.onnx")).graph.node if n.name).encode()
    (work / "badutf8.onnx").write_bytes(raw.replace(name, b"\xff" * len(name), 1))
    (work / "one.json.partial").write_text("1\n")


def run_cli_cases(work: Path) -> list[tuple[str, ...]]:
    rows = []
    pristine = {p.name: p.read_bytes() for p in work.iterdir() if p.is_file() and not p.is_symlink()}
    for issue, case, command in CLI_CASES:
        before = _state(work)
        status, line = _cli(work, command)
        after = _state(work)
        changed = sorted(n for n in before if after.get(n) != before[n])
        new = sorted(set(after) - set(before))
        rows.append((issue, case, str(status), line.replace("|", "\\|").replace(str(work) + "/", ""),
                     ", ".join(changed) or "none", ", ".join(new) or "none"))
        for name in new:
            (work / name).unlink()
        for name in (n for n in changed if n in pristine):  # an overwritten input is restored
            (work / name).write_bytes(pristine[name])
    return rows


def run_signal_cases(work: Path) -> list[tuple[str, ...]]:
    rows = []
    command = f"{shlex.quote(sys.executable)} {shlex.quote(str(work / 'hang.py'))} {{model}}"
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGKILL):
        (work / "pid").unlink(missing_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix="tmp", dir=work))
        argv = [sys.executable, "-m", "quantdbg", "analyze", "q.onnx", "--fp32", "m.onnx", "--eval",
                "eval.npz", "--mode", "isolated", "--no-evidence", "--evaluate", command, "--out", "s.json"]
        process = subprocess.Popen(argv, cwd=work, env={**os.environ, "TMPDIR": str(tmp)}, text=True,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        while (not (work / "pid").exists() or not (work / "pid").read_text()) and process.poll() is None:
            time.sleep(0.05)
        if process.poll() is not None:
            raise RuntimeError(f"analyze ended before its evaluation started: {process.communicate()[1]}")
        child = int((work / "pid").read_text())
        process.send_signal(signum)
        process.wait(timeout=120)
        time.sleep(1.0)
        alive = processes.alive(child)
        if alive:
            os.kill(child, signal.SIGKILL)  # it holds the pipes open
        err = process.stderr.read()
        process.communicate()
        rows.append(("7", f"{signal.Signals(signum).name} during --evaluate", str(process.returncode),
                     (err.strip().splitlines() or [""])[-1], "child killed" if not alive else "CHILD ALIVE",
                     f"{len(list(tmp.iterdir()))} temp folder(s) left"))
        shutil.rmtree(tmp, ignore_errors=True)
    return rows


def _mutate(doc: Any, rng: np.random.Generator) -> str:
    doc = json.loads(json.dumps(doc))
    for _ in range(int(rng.integers(1, 4))):
        paths = list(json_paths(doc))
        path = paths[int(rng.integers(len(paths)))]
        if not path:
            continue
        parent = doc
        for step in path[:-1]:
            parent = parent[step]
        choice = int(rng.integers(6))
        values: list[Any] = [None, True, -1, 2**70, 1e308, "nan", "x", [], {}, [1, "a"], {"k": None}]
        if choice == 0:
            del parent[path[-1]]
        else:
            parent[path[-1]] = values[int(rng.integers(len(values)))]
    text = json.dumps(doc)
    return text[:int(rng.integers(len(text)))] if rng.random() < 0.1 else text


def _tally(name: str, attempts: Iterable[Callable[[], Any]]) -> tuple[str, ...]:
    """Runs every attempt (one read of a mutated input) and counts how each ended: read, one of the
    library's errors by type, or any other exception (an escape, what this script measures)."""
    outcomes: Counter[str] = Counter()
    for attempt in attempts:
        try:
            attempt()
            outcomes["read"] += 1
        except QuantDbgError as err:
            outcomes[type(err).__name__] += 1
        except Exception as err:  # noqa: BLE001 - an escape is what this script measures
            outcomes[f"ESCAPED {type(err).__name__}"] += 1
    escaped = sum(v for k, v in outcomes.items() if k.startswith("ESCAPED"))
    return (name, str(sum(outcomes.values())), str(escaped),
            ", ".join(f"{k} {v}" for k, v in sorted(outcomes.items())))


def _fuzz(name: str, doc: Any, read: Callable[[Path], Any], n: int, work: Path) -> tuple[str, ...]:
    def attempts() -> Iterator[Callable[[], Any]]:
        rng = np.random.default_rng(0)
        path = work / "fuzz.json"
        for _ in range(n):
            path.write_text(_mutate(doc, rng))
            yield lambda: read(path)

    return _tally(name, attempts())


def run_fuzz(work: Path, n: int) -> list[tuple[str, ...]]:
    from quantdbg._journal import Journal
    from quantdbg.diagnostics import DoctorReport
    from quantdbg.fallback import FallbackPlan
    from quantdbg.model import load_model
    from quantdbg.qdq.cache import parse_trt_cache, read_scales_json
    from quantdbg.report import load_result
    from quantdbg.sensitivity import SensitivityReport

    _cli(work, "calibrate m.onnx --data calib.npz --method minmax --out q2.onnx --cache c.cache "
         "--scales s.json")
    _cli(work, "fallback q.onnx --fp32 m.onnx --eval eval.npz --min-sqnr 30 --out mixed.onnx --plan p.json")
    _cli(work, "doctor m.onnx --data calib.npz --checks weight_zeroing --json d.json")
    docs = {n_: json.loads((work / f).read_text()) for n_, f in
            (("sensitivity", "r.json"), ("plan", "p.json"), ("doctor", "d.json"), ("scales", "s.json"))}
    run = {"models": "a", "mode": "isolated"}
    journal = Journal.open(work / "journal.partial", "analyze", run)
    journal.record("evaluation:sweep:isolated:conv", {"comparison": None, "value": 0.5})
    journal.record("report", docs["sensitivity"])

    def read_journal(text: str) -> Any:
        (work / "fuzz.partial").write_text(text)
        return Journal.open(work / "fuzz.partial", "analyze", run)
    rows = [
        _fuzz("SensitivityReport.read", docs["sensitivity"], SensitivityReport.read, n, work),
        _fuzz("FallbackPlan.read", docs["plan"], FallbackPlan.read, n, work),
        _fuzz("DoctorReport.read", docs["doctor"], DoctorReport.read, n, work),
        _fuzz("load_result (doctor)", docs["doctor"], load_result, n, work),
        _fuzz_text("journal (resume)", (work / "journal.partial").read_text(), read_journal, n),
        _fuzz("read_scales_json", docs["scales"], read_scales_json, n, work),
    ]
    cache = (work / "c.cache").read_text()
    rows.append(_fuzz_text("parse_trt_cache", cache, parse_trt_cache, n))
    raw = (work / "m.onnx").read_bytes()
    rows.append(_fuzz_bytes("load_model (protobuf)", raw, lambda p: load_model(p, allow_quantized=True), n,
                            work))
    return rows


def _fuzz_text(name: str, text: str, read: Callable[[str], Any], n: int) -> tuple[str, ...]:
    def attempts() -> Iterator[Callable[[], Any]]:
        rng = np.random.default_rng(0)
        alphabet = list(":\n\r\x85\u2028 0123456789abcdefTRT-x")
        for _ in range(n):
            chars = list(text)
            for _ in range(int(rng.integers(1, 5))):
                chars[int(rng.integers(len(chars)))] = alphabet[int(rng.integers(len(alphabet)))]
            yield functools.partial(read, "".join(chars))

    return _tally(name, attempts())


def _fuzz_bytes(name: str, raw: bytes, read: Callable[[Path], Any], n: int, work: Path) -> tuple[str, ...]:
    def attempts() -> Iterator[Callable[[], Any]]:
        rng = np.random.default_rng(0)
        path = work / "fuzz.onnx"
        for _ in range(n):
            data = bytearray(raw)
            for _ in range(int(rng.integers(1, 5))):
                data[int(rng.integers(len(data)))] = int(rng.integers(256))
            path.write_bytes(bytes(data[:int(rng.integers(len(data)))] if rng.random() < 0.1 else data))
            yield lambda: _quietly(read, path)

    return _tally(name, attempts())


def _quietly(read: Callable[[Path], Any], path: Path) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return read(path)


# Bad numeric data and model storage: each case is refused in one line (exit 2) or works with the same
# scales as the plain model (exit 0). "wrong" counts a refusal that did not happen or a result that
# differs; "traceback" an exception that escaped the library's errors.
REFUSE, SAME = "refused", "same scales"
NUMERIC_CASES = [
    ("NaN in calibration sample 17", "calibrate m.onnx --data calib_nan.npz --method minmax --out x.onnx",
     REFUSE),
    ("Inf in calibration sample 17", "calibrate m.onnx --data calib_inf.npz --method minmax --out x.onnx",
     REFUSE),
    *((f"3e38 in calibration sample 17, {method}",
       f"calibrate m.onnx --data calib_big.npz --method {method} --out x.onnx", REFUSE)
      for method in ("minmax", "percentile", "entropy", "mse")),
    ("3e38 in calibration samples 17 and 40", "calibrate m.onnx --data calib_big2.npz --method minmax "
                                              "--out x.onnx", REFUSE),
    ("NaN in evaluation sample 5", "analyze q.onnx --fp32 m.onnx --eval eval_nan.npz --no-evidence "
                                   "--out x.json", REFUSE),
    ("3e38 weight", "calibrate w_big.onnx --data calib.npz --method minmax --out x.onnx", REFUSE),
    ("NaN weight", "calibrate w_nan.onnx --data calib.npz --method minmax --out x.onnx", REFUSE),
    ("negative label", "analyze q.onnx --fp32 m.onnx --eval labels_neg.npz --labels label --no-evidence "
                       "--out x.json", REFUSE),
    ("label >= number of classes", "analyze q.onnx --fp32 m.onnx --eval labels_big.npz --labels label "
                                   "--no-evidence --out x.json", REFUSE),
    ("dim_param not UTF-8", "calibrate dimutf8.onnx --data calib.npz --method minmax --out x.onnx", REFUSE),
    ("external data hard-linked twice", "calibrate linked/m.onnx --data calib.npz --method minmax "
                                        "--out x.onnx --scales x.json", SAME),
    ("every tensor external (size_threshold=0)", "calibrate allext/m.onnx --data calib.npz --method minmax "
                                                 "--out x.onnx --scales x.json", SAME),
]


def _bad_numeric_inputs(work: Path) -> None:
    """The files of NUMERIC_CASES, beside the plain model's reference scales (``ref.json``)."""
    import onnx
    from onnx import numpy_helper

    emb = load_embedded()
    calib, evals = emb.calib[INPUT_NAME][:64], emb.eval_inputs[INPUT_NAME][:64]
    for name, value in (("nan", np.nan), ("inf", np.inf), ("big", 3e38)):
        bad = calib.copy()
        bad[17, 0, 3, 4] = value
        np.savez(work / f"calib_{name}.npz", **{INPUT_NAME: bad})
    bad = calib.copy()
    bad[[17, 40], 0, 3, 4] = 3e38
    np.savez(work / "calib_big2.npz", **{INPUT_NAME: bad})
    bad = evals.copy()
    bad[5, 0, 8, 8] = np.nan
    np.savez(work / "eval_nan.npz", **{INPUT_NAME: bad}, label=emb.labels[:64])
    for name, value in (("neg", -1), ("big", 10)):
        labels = emb.labels[:64].copy()
        labels[3] = value
        np.savez(work / f"labels_{name}.npz", **{INPUT_NAME: evals}, label=labels)
    model = onnx.load(str(work / "m.onnx"))
    for name, value in (("big", 3e38), ("nan", np.nan)):
        bad_model = onnx.ModelProto()
        bad_model.CopyFrom(model)
        weight = bad_model.graph.initializer[0]
        values = numpy_helper.to_array(weight).copy()
        values.flat[0] = value
        weight.CopyFrom(numpy_helper.from_array(values, weight.name))
        onnx.save(bad_model, str(work / f"w_{name}.onnx"))
    batch = model.graph.input[0].type.tensor_type.shape.dim[0].dim_param.encode()
    raw = (work / "m.onnx").read_bytes()
    (work / "dimutf8.onnx").write_bytes(raw.replace(b"\x12" + bytes([len(batch)]) + batch,
                                                    b"\x12" + bytes([len(batch)]) + b"\xff" * len(batch), 1))
    for folder, threshold in (("linked", 1024), ("allext", 0)):
        (work / folder).mkdir()
        fresh = onnx.load(str(work / "m.onnx"))  # saving as external data rewrites the proto it is given
        onnx.save_model(fresh, str(work / folder / "m.onnx"), save_as_external_data=True,
                        all_tensors_to_one_file=True, location="m.onnx.data", size_threshold=threshold)
    os.link(work / "linked" / "m.onnx.data", work / "linked" / "backup.data")
    reference = "calibrate m.onnx --data calib.npz --method minmax --out ref.onnx --scales ref.json"
    assert _cli(work, reference)[0] == 0


def run_numeric_cases(work: Path) -> list[tuple[str, ...]]:
    """One row per NUMERIC_CASES entry: exit status, last stderr line, and whether the outcome was right."""
    rows = []
    reference = json.loads((work / "ref.json").read_text())
    for case, command, expected in NUMERIC_CASES:
        before = _state(work)
        status, line = _cli(work, command)
        if status == -1:
            verdict = "traceback"
        elif expected == REFUSE:
            verdict = "ok" if status == 2 else "wrong: accepted"
        else:
            same = status == 0 and _scales(work / "x.json") == _scales_of(reference)
            verdict = "ok" if same else "wrong: failed or other scales"
        changed = sorted(n for n, digest in before.items() if _state(work).get(n) != digest)
        rows.append((case, str(status), line.replace("|", "\\|").replace(str(work) + "/", ""),
                     ", ".join(changed) or "none", verdict))
        for name in ("x.onnx", "x.json", "x.onnx.data"):
            (work / name).unlink(missing_ok=True)
    return rows


def _scales(path: Path) -> dict[str, float] | None:
    return _scales_of(json.loads(path.read_text())) if path.is_file() else None


def _scales_of(doc: dict[str, Any]) -> dict[str, float]:
    """Tensor -> scale of a scales file (tagged ``quantdbg.scales/1`` with its ``tensors``, or untagged)."""
    entries = doc["tensors"] if "format" in doc else doc
    return {name: entry["scale"] for name, entry in entries.items()}


def numeric_summary(rows: list[tuple[str, ...]]) -> tuple[str, ...]:
    """Cases, tracebacks, wrong results accepted (or failures of what must work)."""
    verdicts = Counter(row[-1].split(":")[0] for row in rows)
    return str(len(rows)), str(verdicts["traceback"]), str(verdicts["wrong"])


def _table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


CATEGORIES = ("cli", "signals", "fuzz", "numeric", "paths", "concurrent", "disk", "names", "resume",
              "grandchildren")


def main_(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mutations", type=int, default=1000, help="Mutations per reader (default 1000).")
    parser.add_argument("--categories", nargs="+", choices=CATEGORIES, default=list(CATEGORIES),
                        help="Which groups of cases to run (default all).")
    args = parser.parse_args(argv)
    chosen = set(args.categories)
    with tempfile.TemporaryDirectory(prefix="quantdbg-reliability-") as tmp:
        work = Path(tmp)
        _setup(work)
        _bad_inputs(work)
        cli = run_cli_cases(work) if "cli" in chosen else []
        signals = run_signal_cases(work) if "signals" in chosen else []
        fuzz = run_fuzz(work, args.mutations) if "fuzz" in chosen else []
        numeric: list[tuple[str, ...]] = []
        if "numeric" in chosen:
            _bad_numeric_inputs(work)
            numeric = run_numeric_cases(work)
        outputs.path_inputs(work, _cli)
        checked = [*(outputs.run_path_cases(work, _cli, _state) if "paths" in chosen else []),
                   *(outputs.run_concurrent_cases(work, _cli) if "concurrent" in chosen else []),
                   *(outputs.run_disk_cases(work, _cli, _state) if "disk" in chosen else [])]
        if "names" in chosen:
            names.hostile_inputs(work)
            checked += names.run_name_cases(work, _run, _state)
        if "resume" in chosen:
            resume.resume_inputs(work)
            checked += resume.run_resume_cases(work, _run)
        if "grandchildren" in chosen:
            checked += processes.run_process_cases(work)
    tables = [
        (("issue case", "what", "exit", "stderr (last line)", "inputs changed", "files written"), cli),
        (("issue case", "what", "exit", "stderr (last line)", "--evaluate child", "temp folders"), signals),
        (("reader", "mutations", "escaped", "outcomes"), fuzz),
        (("bad numeric data / model storage", "exit", "stderr (last line)", "inputs changed", "outcome"),
         numeric),
        (("bad numeric data", "cases", "tracebacks", "wrong results accepted"),
         [("total", *numeric_summary(numeric))] if numeric else []),
        (("category", "case", "expected", "exit", "stderr (last line)", "inputs changed", "verdict"),
         checked),
        (("category", "cases tried", "tracebacks", "inputs changed", "wrong results accepted",
          "wrongly refused"), outputs.summary(checked)),
    ]
    print("\n\n".join(_table(header, rows) for header, rows in tables if rows))
    return 0


if __name__ == "__main__":
    sys.exit(main_())
