"""The package layout is the pipeline: lower stages never import higher ones, and nothing forms a circle.

Every import counts -- module top, inside functions, under ``TYPE_CHECKING`` -- because each of
them is an arrow a reader has to follow. A stage may import its own stage and the ones before it.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "quantdbg"

STAGES: tuple[tuple[str, ...], ...] = (
    ("errors", "_version", "_optional", "_io", "_json", "_progress", "_display", "quant_math",
     "_calibrator_specs", "config", "_fingerprint", "_journal", "execution"),
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

ALLOWED_DYNAMIC: dict[tuple[str, str], str] = {
    ("quantdbg", "__getattr__"):
        "the public API is re-exported lazily (PEP 562): a name's module is imported on first access, so "
        "`import quantdbg` stays cheap",
    ("quantdbg._display", "_lookup"):
        "the display registry imports the renderer providers named with add_provider (the report package) "
        "on the first lookup, so results lower in the pipeline never import the report package",
    ("quantdbg._optional", "load"):
        "the loader of optional third-party dependencies; its callers are checked to name no quantdbg module",
    ("quantdbg.cli.app", "build_parser"):
        "the subcommand modules, one per command, named in _COMMAND_MODULES (all in the cli stage)",
    ("quantdbg.calibration.calibrators.base", "_load_builtins"):
        "the calibrator registry imports the built-in calibrators on the first lookup, as it loads plugins; "
        "those modules import the registry to register themselves",
}
"""Dynamic imports of quantdbg modules (or of names only known at run time), by module and the function
holding the call, with the reason each may hide its arrow from this test. Any other one fails."""

_IMPORT_CALLS = {"import_module", "__import__"}
"""Functions that import the module they are given by name."""

_OPTIONAL_LOADERS = {"load", "lazy_import"}
"""quantdbg._optional's loaders, which import the module they are given by name."""


@dataclass(frozen=True)
class DynamicImport:
    """An import made by a call rather than a statement."""

    module: str
    function: str
    line: int
    target: str | None
    """The module named by a string constant, None when the name is computed at run time."""

    def third_party(self) -> bool:
        """True for a constant name outside quantdbg (an optional dependency loaded on first use)."""
        return self.target is not None and self.target.split(".")[0] != "quantdbg"


def _module_name(path: Path, root: Path = SRC) -> str:
    rel = path.relative_to(root.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1] if len(parts) > 1 else parts
    return ".".join(parts)


def _modules(root: Path = SRC) -> dict[str, Path]:
    return {_module_name(p, root): p for p in sorted(root.rglob("*.py"))}


def _base_of(node: ast.ImportFrom, module: str, path: Path) -> str:
    """The absolute module a ``from ... import`` statement names (relative levels resolved)."""
    if node.level == 0:
        return node.module or ""
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    if node.level - 1 >= len(package):
        raise AssertionError(f"{path}:{node.lineno}: relative import beyond the top-level package")
    base = package[:len(package) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


def _ours(name: str) -> bool:
    return name == "quantdbg" or name.startswith("quantdbg.")


def _statement_imports(tree: ast.AST, module: str, path: Path, modules: dict[str, Path]) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if _ours(a.name))
        elif isinstance(node, ast.ImportFrom):
            base = _base_of(node, module, path)
            if _ours(base):
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    found.add(sub if sub in modules else base)
    return {name for name in found if name in modules or name == "quantdbg"}


def _optional_loader_names(tree: ast.AST, module: str, path: Path) -> set[str]:
    """The names under which this file holds quantdbg._optional's loaders (``from ... import load``)."""
    return {alias.asname or alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
            and _base_of(node, module, path) == "quantdbg._optional"
            for alias in node.names if alias.name in _OPTIONAL_LOADERS}


def _is_import_call(func: ast.expr, loaders: set[str]) -> bool:
    if isinstance(func, ast.Name):
        return func.id in _IMPORT_CALLS or func.id in loaders
    if isinstance(func, ast.Attribute):
        optional = isinstance(func.value, ast.Name) and func.value.id == "_optional"
        return func.attr in _IMPORT_CALLS or (func.attr in _OPTIONAL_LOADERS and optional)
    return False


def _dynamic_imports(tree: ast.AST, module: str, path: Path) -> list[DynamicImport]:
    loaders = _optional_loader_names(tree, module, path)
    found = []

    def visit(node: ast.AST, function: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Call) and _is_import_call(child.func, loaders):
                first = child.args[0] if child.args else None
                named = isinstance(first, ast.Constant) and isinstance(first.value, str)
                found.append(DynamicImport(module, function, child.lineno, first.value if named else None))
            inner = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else function
            visit(child, inner)

    visit(tree, "<module>")
    return found


def _scan(root: Path = SRC) -> tuple[dict[str, set[str]], list[DynamicImport]]:
    """Every module's quantdbg imports (statements anywhere in it, absolute or relative), and every
    dynamic import of the package."""
    modules = _modules(root)
    graph: dict[str, set[str]] = {}
    dynamic: list[DynamicImport] = []
    for name, path in modules.items():
        tree = ast.parse(path.read_text(), str(path))
        graph[name] = _statement_imports(tree, name, path, modules) - {name}
        dynamic += _dynamic_imports(tree, name, path)
    return graph, dynamic


def _imports(path: Path, modules: dict[str, Path], root: Path = SRC) -> set[str]:
    """Every quantdbg module ``path`` imports, wherever the import statement sits."""
    module = _module_name(path, root) if path.is_relative_to(root) else path.stem
    return _statement_imports(ast.parse(path.read_text(), str(path)), module, path, modules)


def _stage(module: str) -> int:
    parts = module.split(".")
    if len(parts) == 1:
        return _STAGE["__init__"]
    return _STAGE[parts[1]]


def _graph(root: Path = SRC) -> dict[str, set[str]]:
    return _scan(root)[0]


def _upward(graph: dict[str, set[str]]) -> list[str]:
    return [f"{src} (stage {_stage(src)}) imports {dst} (stage {_stage(dst)})"
            for src, targets in graph.items() for dst in sorted(targets) if _stage(dst) > _stage(src)]


def _unlisted(dynamic: list[DynamicImport], allowed: dict[tuple[str, str], str]) -> list[str]:
    return [f"{d.module}:{d.line} (in {d.function}) imports {d.target or 'a name computed at run time'} "
            "dynamically; import it with a statement, or add it to ALLOWED_DYNAMIC with the reason"
            for d in dynamic if not d.third_party() and (d.module, d.function) not in allowed]


def test_every_module_belongs_to_a_stage():
    unknown = sorted(m for m in _modules() if len(m.split(".")) > 1 and m.split(".")[1] not in _STAGE)
    assert not unknown, f"modules outside every stage of STAGES: {unknown}"


def test_no_module_imports_a_later_stage():
    bad = _upward(_graph())
    assert not bad, "\n".join(bad)


def test_every_dynamic_import_is_allowed_with_a_reason_and_every_allowance_is_used():
    _, dynamic = _scan()
    bad = _unlisted(dynamic, ALLOWED_DYNAMIC)
    assert not bad, "\n".join(bad)
    used = {(d.module, d.function) for d in dynamic if not d.third_party()}
    assert sorted(set(ALLOWED_DYNAMIC) - used) == [], "allowances that match no dynamic import any more"


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


def _fake_package(root: Path, files: dict[str, str]) -> Path:
    """A package named quantdbg under ``root`` holding ``files`` (path -> source), every folder a package."""
    package = root / "quantdbg"
    for rel, source in {"__init__.py": "", **files}.items():
        path = package / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        for folder in path.relative_to(package).parents:
            (package / folder / "__init__.py").touch()
        path.write_text(source)
    return package


def test_a_relative_upward_import_is_caught(tmp_path):
    package = _fake_package(tmp_path, {"model/graph.py": "def f():\n    from ..pipeline import journal\n",
                                       "model/io.py": "from . import graph\n", "pipeline/journal.py": "",
                                       "pipeline/flow.py": "from ..model import io\n"})
    graph = _graph(package)
    assert graph["quantdbg.model.graph"] == {"quantdbg.pipeline.journal"}
    assert graph["quantdbg.model.io"] == {"quantdbg.model.graph"}
    assert _upward(graph) == ["quantdbg.model.graph (stage 1) imports quantdbg.pipeline.journal (stage 11)"]


def test_relative_imports_of_a_package_init_resolve_against_the_package_itself(tmp_path):
    package = _fake_package(tmp_path, {"report/__init__.py": "from .html import page\nfrom . import plots\n",
                                       "report/html.py": "", "report/plots.py": ""})
    assert _graph(package)["quantdbg.report"] == {"quantdbg.report.html", "quantdbg.report.plots"}


def test_a_relative_cycle_is_caught(tmp_path):
    package = _fake_package(tmp_path, {"qdq/a.py": "from .b import g\n", "qdq/c.py": "from . import a\n",
                                       "qdq/b.py": "def g():\n    from . import c\n"})
    assert _cycles(_graph(package)) == [["quantdbg.qdq.a", "quantdbg.qdq.b", "quantdbg.qdq.c"]]


def test_an_unlisted_dynamic_import_is_caught(tmp_path):
    package = _fake_package(tmp_path, {"model/load.py": (
        "import importlib\nfrom importlib import import_module\nfrom quantdbg import _optional\n"
        "from quantdbg._optional import load as fetch\n"
        "def f(name):\n    importlib.import_module('quantdbg.report')\n    import_module(name)\n"
        "    __import__('quantdbg.cli')\n    _optional.lazy_import('quantdbg.pipeline', 'x')\n"
        "    fetch('matplotlib', 'report')\n"
        "    return _optional.load('onnxruntime', 'x')\n")})
    _, dynamic = _scan(package)
    assert [(d.function, d.line, d.target, d.third_party()) for d in dynamic] == [
        ("f", 6, "quantdbg.report", False), ("f", 7, None, False), ("f", 8, "quantdbg.cli", False),
        ("f", 9, "quantdbg.pipeline", False), ("f", 10, "matplotlib", True), ("f", 11, "onnxruntime", True)]
    assert len(_unlisted(dynamic, {})) == 4  # the third-party extras are not quantdbg's arrows
    assert _unlisted(dynamic, {("quantdbg.model.load", "f"): "a reason"}) == []
    assert _unlisted(dynamic, {("quantdbg.model.load", "g"): "a reason"})[0] == (
        "quantdbg.model.load:6 (in f) imports quantdbg.report dynamically; import it with a statement, or "
        "add it to ALLOWED_DYNAMIC with the reason")


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
