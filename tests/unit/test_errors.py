"""Error hierarchy: each error is also the builtin a caller would catch; unknown names get hints."""
from __future__ import annotations

import pytest

from quantdbg.errors import (
    BackendError,
    ConfigError,
    DataError,
    MissingDependencyError,
    ModelError,
    QuantDbgError,
    unknown,
)


@pytest.mark.parametrize("cls, builtin", [
    (ModelError, ValueError), (DataError, ValueError), (ConfigError, ValueError),
    (MissingDependencyError, ImportError), (BackendError, RuntimeError),
])
def test_errors_inherit_root_and_builtin(cls, builtin):
    assert issubclass(cls, QuantDbgError) and issubclass(cls, builtin)


def test_unknown_suggests_close_names():
    err = unknown("node", "conv_2", ["conv_1", "conv2", "relu"])
    assert isinstance(err, ModelError)
    assert str(err) == "No node named 'conv_2' in the model. Did you mean 'conv2', 'conv_1'?"
    assert str(unknown("tensor", "zzz", ["a"], DataError)) == "No tensor named 'zzz' in the model."
