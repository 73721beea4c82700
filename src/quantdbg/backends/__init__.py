"""Backends that run ONNX models: ONNX Runtime (always) and TensorRT (where it imports).

Backend modules are imported on first use, so ``import quantdbg.backends`` never imports
TensorRT.
"""
from quantdbg._exports import public_names as _public_names
from quantdbg.backends.base import Runner as Runner
from quantdbg.backends.base import RunnerFactory as RunnerFactory
from quantdbg.backends.onnxrt import OnnxrtRunner as OnnxrtRunner
from quantdbg.backends.onnxrt import OnnxrtRunnerFactory as OnnxrtRunnerFactory
from quantdbg.backends.onnxrt import OrtConfig as OrtConfig
from quantdbg.backends.registry import BACKENDS as BACKENDS
from quantdbg.backends.registry import BackendName as BackendName
from quantdbg.backends.registry import available as available
from quantdbg.backends.registry import make_runner_factory as make_runner_factory

__all__ = _public_names(globals())
