"""Fixtures for the TensorRT tests, which run only where TensorRT, cuda-python and a GPU exist.

Every test module here starts with ``pytest.importorskip("tensorrt", ...)``; that alone is not
enough, because ``tensorrt-stubs`` leaves an importable, empty ``tensorrt`` namespace package. The
``trt_ready`` fixture (used by every test) therefore skips with the backend's own reason --
bindings missing, cuda-python missing, or no CUDA device -- so a skip always says why.
"""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest


@pytest.fixture(scope="session")
def trt_ready() -> None:
    from quantdbg.backends.tensorrt import unavailable_reason

    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(f"TensorRT backend cannot run here: {reason}")


@pytest.fixture
def ort_outputs():
    """Runs a model in ONNX Runtime on the CPU (one thread): the reference TensorRT is compared to."""
    def run(model, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        names = [o.name for o in session.get_outputs()]
        return dict(zip(names, session.run(names, feed), strict=True))
    return run
