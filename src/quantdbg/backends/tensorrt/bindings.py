"""The TensorRT and CUDA runtime bindings, loaded on first use (the ``quantdbg[tensorrt]`` extra).

Nothing here imports TensorRT or cuda-python at module import: ``trt`` is a proxy that imports the
``tensorrt`` module on first attribute access, after :func:`load_tensorrt` has checked the bindings
are real.

Device memory, streams and CUDA events come from **cuda-python** (``cuda.bindings.runtime``, NVIDIA's
official binding of the CUDA runtime API), not from hand-written ctypes and not from
``polygraphy.cuda``. Reasons: it is the binding TensorRT's own Python samples use; it covers events
(``cudaEventRecord``/``cudaEventElapsedTime``), which ``polygraphy.cuda`` lacks, so latency is timed
on the GPU rather than with a host clock; and it reports errors as return codes that
:func:`cuda_check` turns into :class:`~quantdbg.errors.BackendError`, where Polygraphy's wrapper logs
to stdout through its own logger. Older cuda-python releases expose the same API as ``cuda.cudart``;
both are accepted.
"""
from __future__ import annotations

from types import ModuleType
from typing import TYPE_CHECKING, Any

from quantdbg import _optional
from quantdbg.errors import BackendError, MissingDependencyError

if TYPE_CHECKING:
    import tensorrt as trt
else:
    # Resolved on first attribute access, after load_tensorrt() has checked the bindings are real.
    trt = _optional.lazy_import("tensorrt", "tensorrt")

__all__ = ["cuda_check", "cudart", "load_tensorrt", "trt", "unavailable_reason"]


def load_tensorrt() -> ModuleType:
    """Imports the TensorRT bindings, refusing a stubs-only ``tensorrt`` namespace package.

    Returns:
        The ``tensorrt`` module.

    Raises:
        MissingDependencyError: TensorRT does not import, or only its type stubs are installed.
    """
    module = _optional.load("tensorrt", "tensorrt")
    if not hasattr(module, "Builder"):
        # `pip install tensorrt-stubs` leaves a `tensorrt/` folder holding only .pyi files, which
        # Python imports as an empty namespace package.
        where = ", ".join(getattr(module, "__path__", [])) or "?"
        raise MissingDependencyError(
            f"'tensorrt' imports from {where} but has no bindings (no tensorrt.Builder): only type stubs "
            "are installed there. Install TensorRT itself (`quantdbg[tensorrt]`, from NVIDIA's index) "
            "on a machine with an NVIDIA GPU.")
    return module


def cudart() -> Any:
    """Imports the CUDA runtime binding of cuda-python (new or old module path).

    Returns:
        The ``cuda.bindings.runtime`` (or ``cuda.cudart``) module.

    Raises:
        MissingDependencyError: cuda-python is not installed.
    """
    try:
        return _optional.load("cuda.bindings.runtime", "tensorrt")
    except MissingDependencyError:
        return _optional.load("cuda.cudart", "tensorrt")


def unavailable_reason() -> str | None:
    """Says why the TensorRT backend cannot run here, or returns None when it can.

    Checks, in order: the ``tensorrt`` bindings, cuda-python, and a visible CUDA device.

    Returns:
        A one-line reason, or None.
    """
    try:
        load_tensorrt()
        runtime = cudart()
    except MissingDependencyError as err:
        return str(err)
    status, count = runtime.cudaGetDeviceCount()
    if status != runtime.cudaError_t.cudaSuccess or count < 1:
        return f"No CUDA device is usable (cudaGetDeviceCount: {status}, {count} device(s))."
    return None


def cuda_check(result: Any, what: str) -> Any:
    """Unpacks a cuda-python ``(error, value...)`` tuple.

    Args:
        result: What the cuda-python call returned.
        what: The call, for the error message.

    Returns:
        The single value, or the tuple of values (empty when the call returns only its status).

    Raises:
        BackendError: The status is not ``cudaSuccess``.
    """
    runtime = cudart()
    err, values = (result[0], result[1:]) if isinstance(result, tuple) else (result, ())
    if err != runtime.cudaError_t.cudaSuccess:
        name = getattr(err, "name", str(err))
        raise BackendError(f"CUDA call {what} failed with {name}. Check the GPU, driver and CUDA runtime.")
    return values[0] if len(values) == 1 else values
