"""Whether the TensorRT backend can run here, found without the backend's own code.

The TensorRT tests skip when it cannot; the reason they skip on must not come from the code under
test alone (a bug there would skip them all), so this module tries the imports and the device query
itself, and the tests check that ``unavailable_reason()`` agrees.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass


@dataclass(frozen=True)
class Missing:
    """What is missing, and the detail."""

    what: str
    """``"tensorrt"``, ``"bindings"`` (type stubs only), ``"cuda-python"`` or ``"device"``."""
    detail: str


def missing() -> Missing | None:
    """What keeps TensorRT from running here (None: the bindings, cuda-python and a GPU are there)."""
    try:
        tensorrt = importlib.import_module("tensorrt")
    except ImportError as err:
        return Missing("tensorrt", f"import tensorrt: {err}")
    if not hasattr(tensorrt, "Builder"):  # tensorrt-stubs leaves an empty namespace package
        return Missing("bindings", f"tensorrt at {list(getattr(tensorrt, '__path__', []))} has no Builder")
    runtime = None
    for name in ("cuda.bindings.runtime", "cuda.cudart"):
        try:
            runtime = importlib.import_module(name)
            break
        except ImportError as err:
            detail = f"import {name}: {err}"
    if runtime is None:
        return Missing("cuda-python", detail)
    status, count = runtime.cudaGetDeviceCount()
    if status != runtime.cudaError_t.cudaSuccess or count < 1:
        return Missing("device", f"cudaGetDeviceCount: {status}, {count}")
    return None


REASON_SAYS = {
    "tensorrt": "'tensorrt' is required here",
    "bindings": "but has no bindings (no tensorrt.Builder)",
    "cuda-python": "'cuda.cudart' is required here",
    "device": "No CUDA device is usable",
}
"""What ``unavailable_reason()`` must say for each kind of absence."""


def check_agreement(reason: str | None) -> Missing | None:
    """Asserts that ``reason`` (from ``unavailable_reason()``) agrees with :func:`missing` and returns it."""
    found = missing()
    if found is None:
        assert reason is None, f"TensorRT, cuda-python and a GPU are here; unavailable_reason(): {reason!r}"
    else:
        assert reason is not None and REASON_SAYS[found.what] in reason, (
            f"{found.what} is missing ({found.detail}), yet unavailable_reason() says {reason!r}")
    return found
