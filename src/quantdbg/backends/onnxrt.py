"""ONNX Runtime backend: CPU by default, CUDA/TensorRT execution providers when installed."""
from __future__ import annotations

import contextlib
import difflib
import os
import re
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import onnx

from quantdbg._json import Serializable
from quantdbg.backends.base import Runner, RunnerFactory
from quantdbg.errors import BackendError, ConfigError, QuantDbgError, unknown
from quantdbg.model.specs import TensorSpec, input_specs, output_specs
from quantdbg.model.staging import StagedModel, staged

Provider = Literal["CPUExecutionProvider", "CUDAExecutionProvider", "TensorrtExecutionProvider"]
PROVIDERS: tuple[str, ...] = ("CPUExecutionProvider", "CUDAExecutionProvider", "TensorrtExecutionProvider")
OptimizationLevel = Literal["disable", "basic", "extended", "all"]
_LEVELS = {"disable": "ORT_DISABLE_ALL", "basic": "ORT_ENABLE_BASIC",
           "extended": "ORT_ENABLE_EXTENDED", "all": "ORT_ENABLE_ALL"}
# ONNX Runtime's message when a provider has no kernel for an op/type combination.
_NO_KERNEL = re.compile(r"Could not find an implementation for (\w+)\(\d+\) node with name '([^']*)'")

ModelInput = onnx.ModelProto | str | os.PathLike


@dataclass(frozen=True)
class OrtConfig(Serializable):
    """ONNX Runtime session settings.

    Attributes:
        providers: Execution providers in priority order. Each listed provider must be usable;
            quantdbg never silently falls back to another one.
        intra_op_num_threads: Threads inside one op (0: ONNX Runtime's default, all cores).
        inter_op_num_threads: Threads across ops (0: default).
        graph_optimization_level: ``"disable"`` runs the graph exactly as written; higher
            levels fuse and constant-fold float ops (faster, same Q/DQ arithmetic). ``"all"`` adds
            the NCHWc convolution layout (about 1.8x faster on a small CNN), whose channel block
            is the CPU's vector width (8 on AVX2, 16 on AVX-512): float sums, and the INT8
            roundings that sit on a boundary, then differ in the last bit between machines (a
            logits SQNR by about 0.01 dB). Use ``"extended"`` when runs on different CPUs must
            agree more closely.
        log_severity_level: ONNX Runtime's log level (0 verbose ... 4 fatal).
        fuse_qdq: Let ONNX Runtime replace DQ -> op -> Q patterns with its own integer kernels
            (QLinearMatMul, MatMulIntegerToFloat, ...). Off by default: those kernels have their
            own numerics (on x86 without VNNI, u8s8 products can saturate), so the result would
            describe ONNX Runtime's CPU int8 path, not the Q/DQ arithmetic TensorRT implements.
            With it off, every Q/DQ pair is simulated exactly as ONNX defines it.
    """

    providers: tuple[Provider, ...] = ("CPUExecutionProvider",)
    intra_op_num_threads: int = 0
    inter_op_num_threads: int = 0
    graph_optimization_level: OptimizationLevel = "all"
    log_severity_level: int = 3
    fuse_qdq: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.providers, str):
            raise ConfigError("providers takes a sequence of provider names, not one string.")
        object.__setattr__(self, "providers", tuple(self.providers))
        if not self.providers:
            raise ConfigError("providers is empty; list at least 'CPUExecutionProvider'.")
        for provider in self.providers:
            if provider not in PROVIDERS:
                near = difflib.get_close_matches(str(provider), PROVIDERS, n=1)
                hint = f" Did you mean {near[0]!r}?" if near else ""
                raise ConfigError(f"Unknown execution provider {provider!r}; quantdbg supports "
                                  f"{', '.join(PROVIDERS)}.{hint}")
        if self.graph_optimization_level not in _LEVELS:
            raise ConfigError(f"graph_optimization_level must be one of {sorted(_LEVELS)}, "
                              f"got {self.graph_optimization_level!r}.")
        for name in ("intra_op_num_threads", "inter_op_num_threads"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must be >= 0 (0: ONNX Runtime's default), "
                                  f"got {getattr(self, name)}.")
        if not 0 <= self.log_severity_level <= 4:
            raise ConfigError(f"log_severity_level must be in 0..4, got {self.log_severity_level}.")


class OnnxrtRunner(Runner):
    """Runs a model with ONNX Runtime.

    Args:
        model: A ModelProto (serialised when activated; the caller's object is not kept alive
            beyond that) or the path of a ``.onnx`` file.
        config: Session settings.

    Example::

        with OnnxrtRunner(model, OrtConfig(intra_op_num_threads=1)) as runner:
            outputs = runner.infer({"x": x})
    """

    name = "onnxrt"

    def __init__(self, model: ModelInput, config: OrtConfig | None = None) -> None:
        super().__init__()
        self.model = model
        self.config = config if config is not None else OrtConfig()
        self._session: Any = None
        self._inputs: dict[str, TensorSpec] | None = None
        self._outputs: tuple[str, ...] | None = None

    def input_specs(self) -> dict[str, TensorSpec]:
        """The model's inputs (read from the model, no session needed)."""
        if self._inputs is None:
            self._read_specs()
        assert self._inputs is not None
        return self._inputs

    def output_names(self) -> tuple[str, ...]:
        """The model's outputs, in graph order."""
        if self._outputs is None:
            self._read_specs()
        assert self._outputs is not None
        return self._outputs

    def _read_specs(self) -> None:
        if isinstance(self.model, onnx.ModelProto):
            proto = self.model
        else:
            try:
                proto = onnx.load(str(self.model), load_external_data=False)
            except Exception as err:  # protobuf and OS errors alike
                raise BackendError(f"onnxrt: cannot read model {str(self.model)!r}: {err}") from err
        self._inputs = input_specs(proto)
        self._outputs = tuple(output_specs(proto))

    def _activate(self) -> None:
        ort = _ort()
        self._check_providers(ort)
        options = ort.SessionOptions()
        options.intra_op_num_threads = self.config.intra_op_num_threads
        options.inter_op_num_threads = self.config.inter_op_num_threads
        options.graph_optimization_level = getattr(ort.GraphOptimizationLevel,
                                                   _LEVELS[self.config.graph_optimization_level])
        options.log_severity_level = self.config.log_severity_level
        # The memory pattern preallocates one block per session from the first run's allocations. On
        # graphs with many parallel branches (the sensitivity's local graphs: a clone per layer and
        # calibrator) that block far exceeds the live peak: MiniLM-L6's evidence pass peaked at 3.4 GB
        # with it and 2.1 GB without; plain evaluation kept its speed within noise (99 vs 104 s).
        options.enable_mem_pattern = False
        if not self.config.fuse_qdq:
            options.add_session_config_entry("session.disable_quant_qdq", "1")
        try:
            with self._staged() as stage:
                self._session = ort.InferenceSession(stage.source, stage.configure(options),
                                                     providers=list(self.config.providers))
        except QuantDbgError:
            raise
        except Exception as err:  # ORT raises its own pybind exception types
            raise _session_error(err, self.config.providers) from err
        missing = [p for p in self.config.providers if p not in self._session.get_providers()]
        if missing:
            self._session = None
            raise BackendError(f"onnxrt: execution provider {missing[0]} failed to load (ONNX Runtime "
                               "fell back to another provider); check its CUDA/TensorRT libraries, or "
                               "use OrtConfig(providers=('CPUExecutionProvider',)).")

    def _staged(self) -> contextlib.AbstractContextManager[StagedModel]:
        """A path is handed to ONNX Runtime as it is; a ModelProto is staged without copying its
        external weights (:func:`quantdbg.model.staging.staged`)."""
        if not isinstance(self.model, onnx.ModelProto):
            return contextlib.nullcontext(StagedModel(str(self.model)))
        return staged(self.model)

    def _check_providers(self, ort: Any) -> None:
        available = ort.get_available_providers()
        for provider in self.config.providers:
            if provider not in available:
                raise BackendError(
                    f"onnxrt: execution provider {provider} is not available in this onnxruntime build "
                    f"(available: {', '.join(available)}). Install onnxruntime-gpu for CUDA/TensorRT, or "
                    "use OrtConfig(providers=('CPUExecutionProvider',)).")

    def _deactivate(self) -> None:
        self._session = None

    def _infer(self, feed: dict[str, np.ndarray], outputs: list[str] | None) -> dict[str, np.ndarray]:
        names = list(self.output_names()) if outputs is None else list(outputs)
        for name in names:
            if name not in self.output_names():
                raise unknown("graph output", name, self.output_names(), BackendError)
        try:
            values = self._session.run(names, feed)
        except Exception as err:  # ORT raises its own pybind exception types
            raise BackendError(f"onnxrt: inference failed: {err}") from err
        return dict(zip(names, values, strict=True))


def _session_error(err: Exception, providers: tuple[str, ...]) -> BackendError:
    match = _NO_KERNEL.search(str(err))
    if match:
        op, node = match.groups()
        return BackendError(
            f"onnxrt: {', '.join(providers)} has no kernel for {op} node {node!r} with its input types. "
            "If a fallback made this node FP16, rebuild it with remove_qdq(..., precision=Precision.FP32) "
            "for CPU runs; otherwise cast the node's inputs to a type the provider supports.")
    return BackendError(f"onnxrt: cannot create an inference session: {err}")


def _ort() -> Any:
    # onnxruntime is a core dependency, imported here so `import quantdbg.backends` stays cheap.
    import onnxruntime

    return onnxruntime


@dataclass(frozen=True)
class OnnxrtRunnerFactory(RunnerFactory):
    """Makes :class:`OnnxrtRunner` objects that share one configuration.

    Attributes:
        config: Session settings for every runner.
    """

    config: OrtConfig = field(default_factory=OrtConfig)

    def __call__(self, model: onnx.ModelProto) -> OnnxrtRunner:
        """Returns an inactive runner for ``model``."""
        return OnnxrtRunner(model, self.config)
