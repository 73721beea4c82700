"""Building a serialized, strongly typed TensorRT engine from a Q/DQ ONNX model.

The Q/DQ graph quantdbg writes is TensorRT's *explicit quantization* input: every INT8 boundary is a
QuantizeLinear/DequantizeLinear pair, and layers kept out of INT8 in FP16 are already cast in the graph.
The network is therefore built with ``NetworkDefinitionCreationFlag.STRONGLY_TYPED``: TensorRT takes
each tensor's type from the ONNX graph, and no precision builder flag (FP16/INT8/...) is set -- strong
typing forbids them, and TensorRT 11 removed them.
"""
from __future__ import annotations

import logging
import tempfile
import warnings
from pathlib import Path

import onnx

from quantdbg._io import write_bytes_atomic
from quantdbg.backends.tensorrt.bindings import load_tensorrt, trt
from quantdbg.backends.tensorrt.config import TrtConfig, resolve_profile
from quantdbg.errors import BackendError, QuantDbgWarning, unknown
from quantdbg.model import load_model, save_model
from quantdbg.model.external import external_bases, fits_in_protobuf
from quantdbg.model.load import ModelSource
from quantdbg.model.specs import input_specs

_LOG = logging.getLogger(__name__)


class TrtLogger:
    """Routes TensorRT's messages to :mod:`logging` and keeps the errors for exception messages.

    Attributes:
        errors: Every error TensorRT logged, in order.
        trt_logger: The ``trt.ILogger`` to hand to TensorRT (forwards to :meth:`log`).
    """

    def __init__(self) -> None:
        self.errors: list[str] = []
        self.trt_logger = _make_trt_logger(self)

    def log(self, severity: trt.ILogger.Severity, msg: str) -> None:
        """Logs one TensorRT message at the matching :mod:`logging` level (errors are also kept)."""
        if severity in (trt.ILogger.Severity.INTERNAL_ERROR, trt.ILogger.Severity.ERROR):
            self.errors.append(msg)
            _LOG.error("TensorRT: %s", msg)
        elif severity == trt.ILogger.Severity.WARNING:
            _LOG.warning("TensorRT: %s", msg)
        elif severity == trt.ILogger.Severity.INFO:
            _LOG.info("TensorRT: %s", msg)
        else:
            _LOG.debug("TensorRT: %s", msg)

    def last_errors(self, n: int = 5) -> str:
        """The last ``n`` error messages, or a hint when there were none."""
        return "; ".join(self.errors[-n:]) or "TensorRT logged no error (run with -vv for its log)"


def _make_trt_logger(sink: TrtLogger) -> trt.ILogger:
    # The subclass is defined here, not at module level, because trt.ILogger only exists once the
    # bindings are imported.
    class _Forward(trt.ILogger):
        def __init__(self) -> None:
            trt.ILogger.__init__(self)

        def log(self, severity: trt.ILogger.Severity, msg: str) -> None:
            sink.log(severity, msg)

    return _Forward()


def _parse(parser: trt.OnnxParser, model: onnx.ModelProto) -> None:
    if fits_in_protobuf(model) and not external_bases(model):
        ok = parser.parse(model.SerializeToString())
    else:  # weights past 2 GB, or still in the input's data file: the parser reads them from disk
        with tempfile.TemporaryDirectory() as tmp:
            path = save_model(model, Path(tmp) / "model.onnx")
            ok = parser.parse_from_file(str(path))
    if ok:
        return
    lines = []
    for index in range(parser.num_errors):
        error: trt.ParserError = parser.get_error(index)
        lines.append(f"  node {error.node_name()!r} ({error.node_operator()}, #{error.node()}): "
                     f"{error.desc()}")
    raise BackendError("TensorRT's ONNX parser rejected the model:\n" + "\n".join(lines)
                       + "\nFix or remove these nodes (`quantdbg lint MODEL` explains Q/DQ rules TensorRT "
                         "enforces, e.g. zero points must be 0).")


def _apply_config(builder: trt.Builder, network: trt.INetworkDefinition, model: onnx.ModelProto,
                  config: TrtConfig) -> trt.IBuilderConfig:
    built = builder.create_builder_config()
    # DETAILED keeps per-layer types and tactics in the plan for the engine inspector.
    built.profiling_verbosity = trt.ProfilingVerbosity.DETAILED
    if config.builder_optimization_level is not None:
        built.builder_optimization_level = config.builder_optimization_level
    if config.workspace_bytes is not None:
        built.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, config.workspace_bytes)
    if not config.tf32:
        built.clear_flag(trt.BuilderFlag.TF32)
    ranges = resolve_profile(input_specs(model), config.shapes, config.batch)
    network_inputs = {network.get_input(i).name for i in range(network.num_inputs)}
    if ranges:
        profile = builder.create_optimization_profile()
        for name, rng in ranges.items():
            if name not in network_inputs:
                raise unknown("network input", name, network_inputs, error=BackendError)
            profile.set_shape(name, trt.Dims(list(rng.min)), trt.Dims(list(rng.opt)), trt.Dims(list(rng.max)))
        built.add_optimization_profile(profile)
    return built


def _attach_timing_cache(built: trt.IBuilderConfig, path: Path | None) -> trt.ITimingCache:
    """Loads ``path`` (when it exists) as the build's timing cache; the caller keeps it alive."""
    cache = built.create_timing_cache(path.read_bytes() if path is not None and path.is_file() else b"")
    if not built.set_timing_cache(cache, ignore_mismatch=False):
        # A cache from another GPU or TensorRT version is refused; time from scratch instead.
        warnings.warn(f"TensorRT refused the timing cache {str(path)!r} (written by another GPU or TensorRT "
                      "version); building without it and overwriting it afterwards.", QuantDbgWarning,
                      stacklevel=3)
        cache = built.create_timing_cache(b"")
        built.set_timing_cache(cache, ignore_mismatch=False)
    return cache


def build_engine(model: ModelSource, config: TrtConfig | None = None) -> bytes:
    """Builds a serialized, strongly typed TensorRT engine from a Q/DQ ONNX model.

    Args:
        model: The Q/DQ (and FP16-cast) ONNX model, as a path or ModelProto (never modified).
        config: Profile, workspace, timing cache (None: ``TrtConfig()``); ``config.save_engine`` is not
            used here.

    Returns:
        The serialized engine (plan).

    Raises:
        MissingDependencyError: TensorRT is not installed.
        ModelError: The model does not load or validate.
        ConfigError: The optimization profile cannot be worked out from ``config``.
        BackendError: The ONNX parser rejects nodes (each listed with its name) or the build fails.
    """
    load_tensorrt()
    config = TrtConfig() if config is None else config
    proto = load_model(model, allow_quantized=True)
    logger = TrtLogger()
    builder = trt.Builder(logger.trt_logger)
    # TensorRT 10 needs the flag; TensorRT 11 networks are always strongly typed (the flag may go).
    strongly_typed = getattr(trt.NetworkDefinitionCreationFlag, "STRONGLY_TYPED", None)
    network = builder.create_network(0 if strongly_typed is None else 1 << int(strongly_typed))
    parser = trt.OnnxParser(network, logger.trt_logger)
    _parse(parser, proto)
    built = _apply_config(builder, network, proto, config)
    cache = _attach_timing_cache(built, config.timing_cache)
    plan = builder.build_serialized_network(network, built)
    if plan is None:
        raise BackendError(f"TensorRT failed to build the engine: {logger.last_errors()}.")
    if config.timing_cache is not None:
        # The config's cache (the one the build updated), as Polygraphy's save_timing_cache reads it.
        write_bytes_atomic(config.timing_cache, bytes(built.get_timing_cache().serialize()))
    del cache  # kept referenced until here: TensorRT does not own the cache attached to the config
    return bytes(plan)
