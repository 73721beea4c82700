"""Optional dependencies load on first use, and their absence is an error naming the extra."""
from __future__ import annotations

import importlib
import json
import sys
import types

import pytest

from quantdbg import _optional
from quantdbg.errors import MissingDependencyError


def test_load_imports_once_and_returns_the_module(monkeypatch):
    assert _optional.load("json", "unused") is json
    probe = types.ModuleType("quantdbg_probe_dependency")
    monkeypatch.setitem(sys.modules, "quantdbg_probe_dependency", probe)
    imported = []
    real = importlib.import_module
    monkeypatch.setattr(importlib, "import_module", lambda name, *a: imported.append(name) or real(name, *a))
    assert [_optional.load("quantdbg_probe_dependency", "unused") for _ in range(3)] == [probe] * 3
    assert imported == ["quantdbg_probe_dependency"]  # the later calls reuse the first


def test_absent_module_names_the_extra_and_keeps_the_cause(monkeypatch):
    monkeypatch.setitem(sys.modules, "quantdbg_absent_dependency", None)  # import raises ImportError
    _optional.load.cache_clear()
    with pytest.raises(MissingDependencyError) as err:
        _optional.load("quantdbg_absent_dependency", "report")
    assert str(err.value) == ("'quantdbg_absent_dependency' is required here; install `quantdbg[report]` "
                              "(pip install 'quantdbg[report]').")
    assert isinstance(err.value, ImportError) and isinstance(err.value.__cause__, ImportError)
    assert not _optional.is_available("quantdbg_absent_dependency")
    assert _optional.is_available("json")


def test_lazy_import_resolves_on_first_attribute_access(monkeypatch):
    proxy = _optional.lazy_import("json", "unused")
    assert proxy.dumps is json.dumps
    monkeypatch.setitem(sys.modules, "quantdbg_absent_dependency", None)
    _optional.load.cache_clear()
    absent = _optional.lazy_import("quantdbg_absent_dependency", "tensorrt")  # creating it imports nothing
    with pytest.raises(MissingDependencyError, match=r"install `quantdbg\[tensorrt\]`"):
        absent.Builder  # noqa: B018
