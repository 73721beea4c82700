"""Backends that run ONNX models: ONNX Runtime (always) and TensorRT (where it imports).

Backend modules are imported on first use, so ``import quantdbg.backends`` never imports
TensorRT.
"""
from quantdbg.backends.base import Runner, RunnerFactory
from quantdbg.backends.onnxrt import OnnxrtRunner, OnnxrtRunnerFactory, OrtConfig
from quantdbg.backends.registry import available, make_runner_factory

__all__ = [
    "OnnxrtRunner", "OnnxrtRunnerFactory", "OrtConfig", "Runner", "RunnerFactory", "available",
    "make_runner_factory",
]
