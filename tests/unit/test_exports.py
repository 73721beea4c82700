"""A package's __all__ is what its __init__ imports for its API."""
from __future__ import annotations
import __future__

import ast
import importlib
import types
from pathlib import Path

import pytest

import quantdbg
from quantdbg._exports import public_names

SRC = Path(quantdbg.__file__).parent

WITHOUT_API = {"quantdbg.cli": "the command line's entry point: its functions serve the `quantdbg` command"}
"""Packages whose ``__init__`` defines public names but re-exports no Python API, with the reason."""


def test_public_names_keep_imported_api_and_drop_modules_private_names_and_future_features():
    namespace = {"Thing": int, "helper": len, "_private": 1, "submodule": types.ModuleType("m"),
                 "annotations": __future__.annotations, "CONSTANT": 3}
    assert public_names(namespace) == ["CONSTANT", "Thing", "helper"]


def _is_module(dotted: str) -> bool:
    path = SRC.parent.joinpath(*dotted.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _absolute(node: ast.ImportFrom, package: str) -> str:
    """The module a ``from`` import in the ``__init__`` of ``package`` names (a relative one resolved)."""
    if node.level == 0:
        return node.module or ""
    parts = package.split(".")
    return ".".join([*parts[:len(parts) - node.level + 1], *([node.module] if node.module else [])])


def _bound_names(init: Path, package: str) -> set[str]:
    """The public names the top level of ``init`` binds, submodules and __future__ features aside:
    read from its source, not from the imported package."""
    names: set[str] = set()
    for node in ast.parse(init.read_text()).body:
        if isinstance(node, ast.ImportFrom) and node.module != "__future__":
            base = _absolute(node, package)
            names.update(alias.asname or alias.name for alias in node.names
                         if not _is_module(f"{base}.{alias.name}"))
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
    return {name for name in names if not name.startswith("_")}


SUBPACKAGES = sorted(".".join(init.parent.relative_to(SRC.parent).parts) for init in SRC.rglob("__init__.py")
                     if init.parent != SRC)


def test_the_check_sees_every_subpackage():
    assert len(SUBPACKAGES) == len(list(SRC.rglob("__init__.py"))) - 1
    assert {"quantdbg.backends", "quantdbg.backends.tensorrt", "quantdbg.calibration.calibrators",
            "quantdbg.report.sections"} <= set(SUBPACKAGES)


@pytest.mark.parametrize("package", SUBPACKAGES)
def test_every_package_lists_its_api_and_nothing_else(package):
    module = importlib.import_module(package)
    init = SRC.parent.joinpath(*package.split(".")) / "__init__.py"
    bound = _bound_names(init, package)
    if package in WITHOUT_API or not bound:
        assert not getattr(module, "__all__", []), f"{package} has no API to list"
        return
    assert sorted(module.__all__) == sorted(bound), package
    assert all(not isinstance(getattr(module, name), types.ModuleType) for name in module.__all__)
