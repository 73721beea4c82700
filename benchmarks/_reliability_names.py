"""The hostile-names cases of ``reliability.py``: names are data, never code.

A model whose node names and input name hold a newline, ``;``, ``$( )``, backticks, quotes, spaces
or a leading ``-``, and output paths holding the same, go through ``fallback`` and ``auto`` with
``--plan``. Then every form in which a user gets the build commands runs with bash, in an empty
folder, against stub ``trtexec`` / ``polygraphy`` / ``python`` executables that only record their
argv (``tests/tool_grammars.py``): the plan's script (``commands.to_script()`` of the plan read back),
each command of the plan, the command strings in the plan's JSON, the commands printed on stdout,
and the fenced code of ``quantdbg report PLAN --md``; last, a plan whose command strings were edited
by hand to ``touch pwned``. Counted per form: files the shell created (a name run as code), commands
whose argv does not carry the names and paths exactly or that the tool's grammar refuses, scripts
bash could not run.

The runner ``run(work, argv) -> (exit status, last stderr line, stdout)`` (-1: an exception
escaped) and ``state(work) -> {file name: SHA-256}`` come from ``reliability.py``.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import tool_grammars as grammar  # noqa: E402

Run = Callable[[Path, list[str]], tuple[int, str, str]]
State = Callable[[Path], dict[str, str]]

TOUCH = "touch pwned"
"""What a hostile name runs when a shell reads it as code (in the folder the script runs in)."""

PATTERNS = (lambda i: f"n{i}\n{TOUCH} #", lambda i: f"n{i}'; {TOUCH}; '", lambda i: f"-n{i}",
            lambda i: f"n{i}; {TOUCH}", lambda i: f"n{i}$({TOUCH})", lambda i: f"n{i}`{TOUCH}`",
            lambda i: f'n{i}"; {TOUCH}; "', lambda i: f"n{i} with  space")
"""Node names by position; the quantized layers take them in this order (the first three are the
layers the scoring script wants out of INT8)."""

INPUT = f"in put$({TOUCH})`{TOUCH}`\"\n{TOUCH} #"
FOLDER = f"o; {TOUCH} $({TOUCH}) `{TOUCH}` 'q' \"d\"\n-x"
"""The hostile input name and output folder."""

SCORE = """import json, sys
raw = open(sys.argv[1], "rb").read()
import onnx
model = onnx.load_model_from_string(raw)
targets = set(json.load(open(sys.argv[2], encoding="utf-8")))
made = {out: node.op_type for node in model.graph.node for out in node.output}
left = sum(node.name in targets and any(made.get(i) == "DequantizeLinear" for i in node.input)
           for node in model.graph.node)
print(1.0 - 0.1 * left)
"""
"""1.0 once every target layer is out of INT8, 0.1 less per target layer left in INT8."""


def hostile_inputs(work: Path) -> None:
    """``h.onnx`` (the digits CNN with hostile node names), ``i.onnx`` (with a hostile input name)
    and its data, the scoring script, the target layers of each model, and the hostile output folder."""
    import onnx

    from quantdbg.demo import INPUT_NAME, load_embedded

    emb = load_embedded()
    model = onnx.load(str(emb.model_path))
    for node in model.graph.node:
        node.input[:] = [INPUT if name == INPUT_NAME else name for name in node.input]
    model.graph.input[0].name = INPUT
    onnx.save(model, str(work / "i.onnx"))
    np.savez(work / "i_calib.npz", **{INPUT: emb.calib[INPUT_NAME][:64]})
    np.savez(work / "i_eval.npz", **{INPUT: emb.eval_inputs[INPUT_NAME][:64]})
    model = onnx.load(str(emb.model_path))
    quantized = [n for n in model.graph.node if n.op_type in ("Conv", "Gemm")]
    for i, node in enumerate(quantized + [n for n in model.graph.node if n not in quantized]):
        node.name = PATTERNS[i % len(PATTERNS)](i)
    onnx.save(model, str(work / "h.onnx"))
    (work / "h_targets.json").write_text(json.dumps([n.name for n in quantized[:3]]))
    (work / "m_targets.json").write_text(json.dumps(["conv2/Conv", "fc1/Gemm"]))
    (work / "names_score.py").write_text(SCORE)
    (work / FOLDER).mkdir()


SCENARIOS = [
    ("fallback, hostile node names", "fallback", "h", "mixed.onnx", "plan.json"),
    ("fallback, hostile input name", "fallback", "i", "mixed.onnx", "plan.json"),
    ("fallback, hostile output folder", "fallback", "m", f"{FOLDER}/mixed.onnx", f"{FOLDER}/plan.json"),
    ("fallback, outputs starting with '-'", "fallback", "m", "-mixed.onnx", "-plan.json"),
    ("auto, hostile node names and output folder", "auto", "h", f"{FOLDER}/auto.onnx", f"{FOLDER}/auto.json"),
]
"""(case, command, model: ``h`` hostile node names, ``i`` hostile input name, ``m`` the plain digits
CNN; --out, --plan)."""


def _argv(command: str, model: str, out: str, plan: str) -> list[str]:
    data = ("i_calib.npz", "i_eval.npz") if model == "i" else ("calib.npz", "eval.npz")
    targets = "h_targets.json" if model == "h" else "m_targets.json"
    argv = [command, f"{model}.onnx", "--data", data[0], "--eval", data[1], "--evaluate",
            f"{sys.executable} names_score.py {{model}} {targets}", "--min-metric", "0.95",
            f"--out={out}", f"--plan={plan}"]
    return argv + (["--max-fallback", "50", "--repairs"] if command == "auto" else [])


def run_name_cases(work: Path, run: Run, state: State) -> list[tuple[str, ...]]:
    """One row per scenario and form of the build commands."""
    stubs = grammar.stub_tools(work / "stub-bin")
    rows: list[tuple[str, ...]] = []
    edited = None
    for case, command, model, out, plan in SCENARIOS:
        before = state(work)
        status, line, stdout = run(work, _argv(command, model, out, plan))
        changed = sorted(n for n, v in before.items() if state(work).get(n) != v)
        expect = _Expected(work, model, out)
        if status != 0:
            rows.append(("names", case, "-", str(status), _short(line, work), ", ".join(changed) or "none",
                         _verdict(status, changed, [])))
        else:
            for form, scripts in _forms(work, plan, stdout, run, expect):
                found = _execute_all(scripts, work, stubs, expect)
                rows.append(("names", case, form, str(status), found.summary(), ", ".join(changed) or "none",
                             _verdict(-1 if found.tracebacks else status, changed, found.problems())))
            if model == "h" and command == "fallback":
                edited = _edit(work, plan, expect)
        _clean(work, out, plan)
    if edited is not None:
        path, expect = edited
        for form, scripts in _forms(work, path.name, None, run, expect):
            found = _execute_all(scripts, work, stubs, expect)
            verdict = _verdict(-1 if found.tracebacks else 0, [], found.problems())
            rows.append(("names", "plan JSON with command strings edited to `touch pwned`", form, "-",
                         found.summary(), "none", verdict))
    shutil.rmtree(stubs)
    return rows


class _Expected:
    """What every build command must carry: the mixed model path, the source model path, the input
    name (the excluded nodes come from each plan read back)."""

    def __init__(self, work: Path, model: str, out: str) -> None:
        import onnx

        self.mixed = os.path.normpath(out)
        self.source = f"{model}.onnx"
        self.inputs = {i.name for i in onnx.load(str(work / self.source)).graph.input}
        self.exclude: list[str] = []


def _plan(path: Path) -> Any:
    """The fallback plan in a fallback plan or an auto result file."""
    from quantdbg.errors import QuantDbgError
    from quantdbg.fallback import FallbackPlan
    from quantdbg.pipeline import AutoResult

    try:
        return FallbackPlan.read(path)
    except QuantDbgError:
        return AutoResult.read(path).plan


def _forms(work: Path, plan: str, stdout: str | None, run: Run,
           expect: _Expected) -> Iterator[tuple[str, list[str]]]:
    """(form, scripts) for each way a user gets the build commands (printed only with ``stdout``);
    sets the excluded nodes ``expect`` holds to the plan's."""
    try:
        read = _plan(work / plan)
    except Exception as err:  # noqa: BLE001 - counted: the plan does not read back
        yield "plan read back", [f"# TRACEBACK {type(err).__name__}: {err}"]
        return
    expect.exclude = list(read.exclude)
    commands = read.commands
    yield "plan script (commands.to_script())", [commands.to_script()]
    yield "each command of the plan", [command for _, command in commands.lines()]
    if stdout is not None:
        doc = json.loads((work / plan).read_text())
        yield "command strings in the plan's JSON", list(_json_commands(doc))
        yield "commands printed on stdout", _printed(stdout, commands)
    status, line, _ = run(work, ["report", os.path.join(".", plan), "--md", "build.md"])
    if status == -1:
        yield "report --md, Build section", [f"# TRACEBACK {line}"]
    else:
        text = (work / "build.md").read_text() if (work / "build.md").exists() else ""
        yield "report --md, Build section", re.findall(r"```[a-z]*\n(.*?)```", text, re.DOTALL)
    (work / "build.md").unlink(missing_ok=True)


def _json_commands(doc: Any) -> Iterator[str]:
    if isinstance(doc, dict):
        for value in doc.values():
            yield from _json_commands(value)
    elif isinstance(doc, list):
        for value in doc:
            yield from _json_commands(value)
    elif isinstance(doc, str) and doc.startswith(("trtexec ", "polygraphy ", "python -m ", "#")):
        yield doc


def _printed(stdout: str, commands: Any) -> list[str]:
    """The commands as printed, each the text between its header line and the next header."""
    headers = [f"{what}:" for what, _ in commands.lines()]
    chunks, current = [], None
    for line in stdout.splitlines():
        if line in headers:
            current = []
            chunks.append(current)
        elif current is not None:
            current.append(line[2:] if not current and line.startswith("  ") else line)
    return ["\n".join(chunk) for chunk in chunks]


class _Found:
    def __init__(self) -> None:
        self.scripts = self.calls = self.side_effects = self.mangled = self.failed = self.tracebacks = 0

    def summary(self) -> str:
        return (f"{self.scripts} script(s), {self.calls} tool call(s): {self.side_effects} side effect(s), "
                f"{self.mangled} mangled, {self.failed} bash failure(s)")

    def problems(self) -> list[str]:
        return [w for w, n in (("SIDE EFFECT", self.side_effects), ("MANGLED", self.mangled),
                               ("BASH FAILED", self.failed)) if n]


def _execute_all(scripts: list[str], work: Path, stubs: Path, expect: _Expected) -> _Found:
    found = _Found()
    folder = work / "run"
    for script in scripts:
        if script.startswith("# TRACEBACK"):
            found.tracebacks += 1
            continue
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir()
        log = work / "argv.jsonl"
        log.unlink(missing_ok=True)
        env = {**os.environ, "PATH": f"{stubs}{os.pathsep}{os.environ['PATH']}", "STUB_LOG": str(log)}
        done = subprocess.run(["bash", "-c", script], cwd=folder, env=env, capture_output=True, text=True,
                              timeout=60)
        calls = [json.loads(x) for x in log.read_text(encoding="utf-8").splitlines()] if log.exists() else []
        found.scripts += 1
        found.calls += len(calls)
        found.side_effects += len(list(folder.iterdir()))
        found.failed += done.returncode != 0
        found.mangled += sum(not _carries(call, expect) for call in calls)
    shutil.rmtree(folder, ignore_errors=True)
    return found


def _carries(call: list[str], expect: _Expected) -> bool:
    """True when the tool's grammar parses ``call`` and it names the files, input and nodes exactly."""
    tool, *argv = call
    try:
        if tool == "trtexec":
            args = grammar.trtexec().parse_args(argv)
            pinned = [] if args.layerPrecisions is None else [
                item.rsplit(":", 1)[0] for item in args.layerPrecisions.split(",")]
            return (os.path.normpath(args.onnx) == expect.mixed and pinned in ([], expect.exclude)
                    and set(grammar.trtexec_shapes(args.minShapes or "")) <= expect.inputs)
        if tool == "polygraphy":
            args = grammar.polygraphy(argv[0]).parse_args(argv[1:])
            shapes = {value.rpartition(":")[0] for value in (args.trt_min_shapes or [[]])[0]}
            return os.path.normpath(args.model_file) == expect.mixed and shapes <= expect.inputs
        args = grammar.modelopt().parse_args(argv[2:])
        return (argv[:2] == ["-m", "modelopt.onnx.quantization"] and args.nodes_to_exclude == expect.exclude
                and os.path.normpath(args.onnx_path) == expect.source)
    except (grammar.Refused, AssertionError, IndexError):
        return False


def _edit(work: Path, plan: str, expect: _Expected) -> tuple[Path, _Expected]:
    """A copy of ``plan`` whose command strings were replaced with :data:`TOUCH` by hand."""
    doc = json.loads((work / plan).read_text())

    def edit(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: edit(v) for k, v in value.items()}
        if isinstance(value, list):
            return [edit(v) for v in value]
        if isinstance(value, str) and value.startswith(("trtexec ", "polygraphy ", "python -m ", "#")):
            return f"# x\n{TOUCH}" if value.startswith("#") else TOUCH
        return value

    path = work / "edited_plan.json"
    path.write_text(json.dumps(edit(doc)))
    return path, expect


def _clean(work: Path, out: str, plan: str) -> None:
    for name in (out, plan, f"{plan}.partial", f"{out}.data"):
        (work / name).unlink(missing_ok=True)


def _short(line: str, work: Path) -> str:
    return line.replace("|", "\\|").replace("\n", "\\n").replace(str(work) + "/", "")[:160]


def _verdict(status: int, changed: list[str], problems: list[str]) -> str:
    words = (["TRACEBACK"] if status == -1 else []) + (["INPUT CHANGED"] if changed else [])
    words += [f"WRONG ACCEPTED ({', '.join(problems)})"] if problems else []
    return ", ".join(words) or "ok"
