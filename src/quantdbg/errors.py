"""Every exception and warning quantdbg raises.

Each error also inherits the builtin a caller would naturally catch (as scikit-learn's
``NotFittedError(ValueError, AttributeError)`` does), so ``except ValueError`` keeps working.
"""
from __future__ import annotations

import difflib
from collections.abc import Collection


class QuantDbgError(Exception):
    """Root of every error quantdbg raises on purpose (a user error, not a bug)."""


class ModelError(QuantDbgError, ValueError):
    """The ONNX model is invalid, unsupported, or does not contain what was asked for."""


class DataError(QuantDbgError, ValueError):
    """Calibration or evaluation data does not match the model or is unusable."""


class ConfigError(QuantDbgError, ValueError):
    """A configuration value is out of range or inconsistent."""


class MissingDependencyError(QuantDbgError, ImportError):
    """An optional dependency is needed for this feature and is not installed."""


class BackendError(QuantDbgError, RuntimeError):
    """A backend (ONNX Runtime, TensorRT) failed to build or run a model."""


class FormatError(QuantDbgError, ValueError):
    """A file quantdbg reads (result, plan, progress, cache, scales) is malformed or of another format."""


class OutputError(QuantDbgError, OSError):
    """A file cannot be written: a full disk, a folder made read-only, a quota. Nothing was published
    in its place (the previous file, if any, is unchanged); ``errno`` is the system's."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else super().__str__()  # the message, not "[Errno 28] ..."


class NotCalibratedError(QuantDbgError, ValueError):
    """A tensor needs a quantization range that calibration did not produce."""


class QuantDbgWarning(UserWarning):
    """Something is suspicious but the run can continue (e.g. an all-zero tensor)."""


def unknown(kind: str, name: str, known: Collection[str],
            error: type[QuantDbgError] = ModelError) -> QuantDbgError:
    """Builds the error for an unknown name, suggesting close matches.

    Args:
        kind: What was looked up, e.g. ``"node"``, ``"tensor"``, ``"calibrator"``.
        name: The name that was not found.
        known: The names that exist.
        error: The error class to instantiate.

    Returns:
        An error whose message names ``name`` and up to three close matches.
    """
    near = difflib.get_close_matches(name, list(known), n=3)
    hint = f" Did you mean {', '.join(map(repr, near))}?" if near else ""
    return error(f"No {kind} named {name!r} in the model.{hint}")


def check_choice(kind: str, value: str, choices: Collection[str]) -> str:
    """Returns ``value`` when it is one of ``choices`` (a typed vocabulary's values).

    Raises:
        ConfigError: It is not, e.g. ``Unknown sensitivity mode 'global'; choose one of isolated,
            leave-one-out, local, cumulative.``
    """
    if value not in choices:
        raise ConfigError(f"Unknown {kind} {value!r}; choose one of {', '.join(choices)}.")
    return value
