"""The package layout is the pipeline: lower stages never import higher ones, and nothing forms a circle.

Every import counts -- module top, inside functions, under ``TYPE_CHECKING`` -- because each of
them is an arrow a reader has to follow. A stage may import its own stage and the ones before it.
"""
from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "quantdbg"

STAGES: tuple[tuple[str, ...], ...] = (
    ("errors", "_version", "_optional", "_io", "_json", "_progress", "_display", "quant_math",
     "config", "_fingerprint", "_journal", "execution"),
    ("model",),
    ("data",),
    ("placement",),
    ("calibration",),
    ("qdq",),
    ("backends",),
    ("evaluation",),
    ("sensitivity",),
    ("diagnostics",),
    ("fallback",),
    ("pipeline",),
    ("report",),
    ("demo",),
    ("cli",),
    ("__main__", "__init__"),
)
"""The order data flows in: FP32 model and data -> placement -> statistics and ranges -> Q/DQ model
-> runners -> metrics -> sensitivity -> diagnoses -> fallback plan -> automatic flow -> reports -> entry
points."""

_STAGE = {part: i for i, parts in enumerate(STAGES) for part in parts}


def _module_name(path: Path) -> str:
    rel = path.relative_to(SRC.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1] if len(parts) > 1 else parts
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(SRC.rglob("*.py"))}


def _imports(path: Path, modules: dict[str, Path]) -> set[str]:
    """Every quantdbg module ``path`` imports, wherever the import statement sits."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("quantdbg"))
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("quantdbg"):
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                found.add(sub if sub in modules else node.module)
    return {name for name in found if name in modules or name == "quantdbg"}


def _stage(module: str) -> int:
    parts = module.split(".")
    if len(parts) == 1:
        return _STAGE["__init__"]
    return _STAGE[parts[1]]


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(path, modules) - {name} for name, path in modules.items()}


def test_every_module_belongs_to_a_stage():
    unknown = sorted(m for m in _modules() if len(m.split(".")) > 1 and m.split(".")[1] not in _STAGE)
    assert not unknown, f"modules outside every stage of STAGES: {unknown}"


def test_no_module_imports_a_later_stage():
    bad = [f"{src} (stage {_stage(src)}) imports {dst} (stage {_stage(dst)})"
           for src, targets in _graph().items() for dst in sorted(targets) if _stage(dst) > _stage(src)]
    assert not bad, "\n".join(bad)


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycle():
    assert _cycles(_graph()) == []


def test_the_cycle_check_sees_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_imports_inside_functions_and_type_checking_blocks_count(tmp_path):
    source = tmp_path / "probe.py"
    source.write_text("from typing import TYPE_CHECKING\n"
                      "if TYPE_CHECKING:\n    from quantdbg.report.render import ReportBundle\n"
                      "def f():\n    from quantdbg.calibration import stats\n    import quantdbg.model\n")
    found = _imports(source, _modules())
    assert found == {"quantdbg.report.render", "quantdbg.calibration.stats", "quantdbg.model"}


MAX_MODULE_LINES = 600
MAX_FUNCTION_CODE_LINES = 50
MAX_PUBLIC_PARAMETERS = 6


def _code_lines(lines: list[str], node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """Lines of a function that hold code: its docstring, comments and blank lines aside."""
    body = node.body
    doc = range(0)
    if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant) \
            and isinstance(body[0].value.value, str):
        doc = range(body[0].lineno, (body[0].end_lineno or body[0].lineno) + 1)
    return sum(1 for i in range(node.lineno, (node.end_lineno or node.lineno) + 1)
               if i not in doc and lines[i - 1].strip() and not lines[i - 1].strip().startswith("#"))


def _functions() -> list[tuple[Path, ast.FunctionDef | ast.AsyncFunctionDef, list[str]]]:
    found = []
    for path in sorted(SRC.rglob("*.py")):
        text = path.read_text()
        lines = text.splitlines()
        found += [(path, node, lines) for node in ast.walk(ast.parse(text))
                  if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))]
    return found


def test_no_module_is_over_the_size_limit():
    big = [f"{p.relative_to(SRC)}: {n}" for p in sorted(SRC.rglob("*.py"))
           if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES]
    assert not big, big


def test_no_function_is_over_the_size_limit():
    long = [f"{p.relative_to(SRC)}:{f.lineno} {f.name}: {n}" for p, f, lines in _functions()
            if (n := _code_lines(lines, f)) > MAX_FUNCTION_CODE_LINES]
    assert not long, long


def test_no_public_function_takes_too_many_parameters():
    def count(f: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
        args = f.args
        own = 1 if args.args and args.args[0].arg in ("self", "cls") else 0
        return len(args.posonlyargs) + len(args.args) + len(args.kwonlyargs) - own

    wide = [f"{p.relative_to(SRC)}:{f.lineno} {f.name}: {count(f)}" for p, f, _ in _functions()
            if not f.name.startswith("_") and count(f) > MAX_PUBLIC_PARAMETERS]
    assert not wide, wide


def test_the_size_measure_leaves_docstrings_and_comments_out():
    source = 'def f(a):\n    """Doc.\n\n    More doc.\n    """\n    # why\n\n    return a\n'
    node = ast.parse(source).body[0]
    assert isinstance(node, ast.FunctionDef)
    assert _code_lines(source.splitlines(), node) == 2
