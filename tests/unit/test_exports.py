"""A package's __all__ is what its __init__ imports for its API."""
from __future__ import annotations
import __future__

import types

from quantdbg._exports import public_names


def test_public_names_keep_imported_api_and_drop_modules_private_names_and_future_features():
    namespace = {"Thing": int, "helper": len, "_private": 1, "submodule": types.ModuleType("m"),
                 "annotations": __future__.annotations, "CONSTANT": 3}
    assert public_names(namespace) == ["CONSTANT", "Thing", "helper"]


def test_every_package_lists_its_api_and_nothing_else():
    import quantdbg.backends as backends
    import quantdbg.sensitivity as sensitivity

    assert "make_runner_factory" in backends.__all__ and "registry" not in backends.__all__
    assert "analyze_sensitivity" in sensitivity.__all__
    assert not [n for n in (*backends.__all__, *sensitivity.__all__) if n.startswith("_")]
