"""Lazy imports of optional dependencies.

Every module of quantdbg must import without its extras installed; the failure comes at first
use, as a :class:`MissingDependencyError` that names the extra to install.
"""
from __future__ import annotations

import functools
import importlib
from types import ModuleType
from typing import Any

from quantdbg.errors import MissingDependencyError


@functools.cache
def load(module: str, extra: str) -> ModuleType:
    """Imports ``module`` now.

    Args:
        module: Dotted module name, e.g. ``"tensorrt"``.
        extra: The quantdbg extra that installs it, e.g. ``"tensorrt"``.

    Returns:
        The imported module.

    Raises:
        MissingDependencyError: The module cannot be imported.
    """
    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise MissingDependencyError(
            f"{module!r} is required here; install `quantdbg[{extra}]` (pip install 'quantdbg[{extra}]')."
        ) from err


def is_available(module: str) -> bool:
    """Returns True when ``module`` imports (without raising)."""
    try:
        load(module, "?")
    except MissingDependencyError:
        return False
    return True


class _LazyModule:
    def __init__(self, module: str, extra: str) -> None:
        self._module = module
        self._extra = extra

    def __getattr__(self, attr: str) -> Any:
        return getattr(load(self._module, self._extra), attr)


def lazy_import(module: str, extra: str) -> Any:
    """Returns a proxy that imports ``module`` on first attribute access.

    Args:
        module: Dotted module name.
        extra: The quantdbg extra that installs it.

    Returns:
        A proxy object; attribute access raises :class:`MissingDependencyError` when absent.
    """
    return _LazyModule(module, extra)
