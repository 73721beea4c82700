"""Which backends are usable here, and the runner factory of one by name.

The TensorRT backend module is imported on first use, so this never imports TensorRT.
"""
from __future__ import annotations

import difflib
from typing import Any, Literal

from quantdbg.backends.base import Runner, RunnerFactory
from quantdbg.backends.onnxrt import OnnxrtRunnerFactory, OrtConfig
from quantdbg.errors import ConfigError, MissingDependencyError

BackendName = Literal["onnxrt", "tensorrt"]
BACKENDS: tuple[str, ...] = ("onnxrt", "tensorrt")


def available() -> list[str]:
    """Returns the usable backends: ``"onnxrt"`` always, ``"tensorrt"`` when its bindings import.

    A ``tensorrt`` folder holding only type stubs (``tensorrt-stubs``) imports as an empty
    namespace package; it does not count.
    """
    names = ["onnxrt"]
    if _tensorrt_usable():
        names.append("tensorrt")
    return names


def _tensorrt_usable() -> bool:
    from quantdbg.backends.tensorrt.bindings import load_tensorrt  # imports tensorrt, if anything

    try:
        load_tensorrt()
    except MissingDependencyError:
        return False
    return True


def make_runner_factory(backend: BackendName = "onnxrt", config: Any = None) -> RunnerFactory:
    """Returns a callable ``model -> Runner`` for a backend (what sensitivity analysis takes).

    Args:
        backend: ``"onnxrt"`` or ``"tensorrt"``.
        config: That backend's config dataclass (``OrtConfig`` for onnxrt, the TensorRT
            runner's config for tensorrt); None uses its defaults.

    Returns:
        A RunnerFactory; calling it with a ModelProto returns an inactive Runner.

    Raises:
        ConfigError: Unknown backend name, or a config of the wrong type.
        MissingDependencyError: ``tensorrt`` was asked for and cannot be imported.
    """
    if backend == "onnxrt":
        if config is None:
            return OnnxrtRunnerFactory()
        if not isinstance(config, OrtConfig):
            raise ConfigError(f"The onnxrt backend takes an OrtConfig, got {type(config).__name__}.")
        return OnnxrtRunnerFactory(config)
    if backend == "tensorrt":
        from quantdbg.backends.tensorrt.config import TrtConfig  # plain Python: imports no tensorrt

        if config is not None and not isinstance(config, TrtConfig):
            raise ConfigError(f"The tensorrt backend takes a TrtConfig, got {type(config).__name__}.")
        if not _tensorrt_usable():
            raise MissingDependencyError(
                "The tensorrt backend needs TensorRT's Python bindings (tensorrt.Builder), which do not "
                "import here; install `quantdbg[tensorrt]` on a machine with an NVIDIA GPU, or use "
                "backend='onnxrt'.")
        return _TrtRunnerFactory(config)
    near = difflib.get_close_matches(str(backend), BACKENDS, n=1)
    hint = f" Did you mean {near[0]!r}?" if near else ""
    raise ConfigError(f"Unknown backend {backend!r}; expected one of {list(BACKENDS)}.{hint}")


class _TrtRunnerFactory(RunnerFactory):
    """Makes TensorRT runners; the TensorRT runner module is imported on first call."""

    def __init__(self, config: Any = None) -> None:
        self.config = config

    def __call__(self, model: Any) -> Runner:
        from quantdbg.backends.tensorrt.runner import TrtRunner  # imports tensorrt only when activated

        return TrtRunner(model, self.config)
