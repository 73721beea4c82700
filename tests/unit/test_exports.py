"""Every package's public surface is small and static: a literal ``__all__`` that static tools read
(as onnx-graphsurgeon's), every name in it resolves, and nothing else is public in ``dir()``."""
from __future__ import annotations

import ast
import importlib
import pkgutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

import quantdbg

ROOT = Path(quantdbg.__file__).parent

CEILING = 12
"""Most names a package lists; the few packages users work in most get more, below."""
CEILINGS = {"quantdbg": 50, "quantdbg.calibration": 24, "quantdbg.calibration.calibrators": 15}
SUBPACKAGES_CEILING = 150
"""All names the sub-packages list together (they listed 353 when ``__all__`` was computed)."""


def _packages() -> list[str]:
    found = (m.name for m in pkgutil.walk_packages([str(ROOT)], prefix="quantdbg.") if m.ispkg)
    return ["quantdbg", *sorted(found)]


PACKAGES = _packages()


def _init(package: str) -> Path:
    return ROOT.joinpath(*package.split(".")[1:], "__init__.py")


def _assigned(node: ast.AST) -> bool:
    """True for a statement that binds or extends ``__all__``."""
    targets = node.targets if isinstance(node, ast.Assign) else \
        [node.target] if isinstance(node, (ast.AnnAssign, ast.AugAssign)) else []
    return any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets)


def _literal_all(path: Path) -> list[str]:
    """The one ``__all__`` the module body assigns, as a list of string literals (else the test fails)."""
    tree = ast.parse(path.read_text(), str(path))
    found = [node for node in ast.walk(tree) if _assigned(node)]
    assert len(found) == 1, f"{path}: {len(found)} statements bind __all__, expected 1"
    node = found[0]
    assert node in tree.body and not isinstance(node, ast.AugAssign), \
        f"{path}:{node.lineno}: __all__ is not assigned once at module level"
    value = node.value
    assert isinstance(value, ast.List) and all(
        isinstance(e, ast.Constant) and isinstance(e.value, str) for e in value.elts
    ), f"{path}: __all__ is not a list of string literals"
    return [e.value for e in value.elts]


def _submodules(module: ModuleType) -> set[str]:
    return {m.name for m in pkgutil.iter_modules(module.__path__)}


def test_the_walk_reaches_the_nested_packages():
    assert {"quantdbg.backends.tensorrt", "quantdbg.calibration.smoothing",
            "quantdbg.calibration.calibrators", "quantdbg.diagnostics.checks",
            "quantdbg.report.sections"} <= set(PACKAGES)
    on_disk = {".".join(("quantdbg", *p.parent.relative_to(ROOT).parts)) for p in ROOT.rglob("__init__.py")}
    assert on_disk == set(PACKAGES)


@pytest.mark.parametrize("package", PACKAGES)
def test_all_is_a_sorted_literal_and_every_name_resolves(package):
    listed = _literal_all(_init(package))
    module = importlib.import_module(package)
    assert module.__all__ == listed, f"{package}.__all__ differs from the literal its __init__ assigns"
    assert listed == sorted(set(listed)), f"{package}.__all__ is not sorted or repeats a name"
    for name in listed:
        obj = getattr(module, name)
        assert not isinstance(obj, ModuleType), f"{package}.{name} is a module, not an API name"
        assert not name.startswith("_"), f"{package} lists the private {name}"


@pytest.mark.parametrize("package", PACKAGES)
def test_nothing_outside_all_is_public(package):
    """No helper (``Any``, ``annotations``, ``importlib``, ...) and no internal re-export leaks."""
    module = importlib.import_module(package)
    public = {n for n in dir(module) if not n.startswith("_")}
    leaked = public - set(module.__all__) - _submodules(module)
    assert not leaked, f"{package} has public names outside __all__: {sorted(leaked)}"


@pytest.mark.parametrize("package", PACKAGES)
def test_each_package_lists_few_names(package):
    ceiling = CEILINGS.get(package, CEILING)
    assert len(_literal_all(_init(package))) <= ceiling, f"{package} lists more than {ceiling} names"


def test_the_sub_packages_list_few_names_together():
    total = sum(len(_literal_all(_init(p))) for p in PACKAGES if p != "quantdbg")
    assert total <= SUBPACKAGES_CEILING


def test_top_level_dir_is_the_api_and_the_version_only():
    """In a fresh interpreter: ``import quantdbg`` imports nothing heavy, and ``dir`` shows the API."""
    code = ("import sys, quantdbg\n"
            "print(sorted(m for m in ('onnx', 'numpy', 'onnxruntime') if m in sys.modules))\n"
            "print(dir(quantdbg))\nprint(quantdbg.__all__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    heavy, shown, listed = (ast.literal_eval(line) for line in out.splitlines())
    assert heavy == []
    assert shown == sorted([*listed, "__version__"])


def test_the_top_level_resolves_exactly_the_names_it_lists():
    lazy = [name for names in quantdbg._HOMES.values() for name in names]
    assert sorted(lazy) == quantdbg.__all__
    with pytest.raises(AttributeError, match=r"^module 'quantdbg' has no attribute 'collect_stats'$"):
        quantdbg.collect_stats  # noqa: B018  (public in quantdbg.calibration, not at the top)


def test_the_literal_checker_refuses_computed_and_extended_lists(tmp_path):
    init = tmp_path / "__init__.py"
    for source in ("__all__ = sorted(['b', 'a'])\n", "__all__ = ['a']\n__all__ += ['b']\n",
                   "names = ['a']\n__all__ = names\n", "x = 1\n"):
        init.write_text(source)
        with pytest.raises(AssertionError):
            _literal_all(init)
    init.write_text("__all__: list[str] = ['a', 'b']\n")
    assert _literal_all(init) == ["a", "b"]
