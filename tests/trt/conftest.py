"""Fixtures for the TensorRT tests, which run only where TensorRT, cuda-python and a GPU exist.

Every test module here starts with ``pytest.importorskip("tensorrt", ...)``; that alone is not
enough, because ``tensorrt-stubs`` leaves an importable, empty ``tensorrt`` namespace package. The
``trt_ready`` fixture (used by every test) therefore finds out itself whether the bindings,
cuda-python and a CUDA device are there, skips with that reason when one is missing, and fails when
the backend's own ``unavailable_reason()`` disagrees (a bug there must not skip every test).
"""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
import tensorrt_presence


@pytest.fixture(scope="session")
def trt_ready() -> None:
    from quantdbg.backends.tensorrt import unavailable_reason

    found = tensorrt_presence.check_agreement(unavailable_reason())
    if found is not None:
        pytest.skip(f"TensorRT backend cannot run here: {found.what} is missing ({found.detail})")


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
