"""TensorRT backend: build a strongly typed engine from a Q/DQ ONNX model, run it, inspect it.

The Q/DQ graph quantdbg writes is TensorRT's *explicit quantization* input: every INT8 boundary is a
QuantizeLinear/DequantizeLinear pair, and FP16 fallback layers are already cast to FP16 in the graph.
The network is therefore built with ``NetworkDefinitionCreationFlag.STRONGLY_TYPED``: TensorRT takes
each tensor's type from the ONNX graph, and no precision builder flag (FP16/INT8/...) is set -- strong
typing forbids them, and TensorRT 11 removed them.

What runs where:

* :class:`TrtConfig`, :class:`ShapeRange`, :func:`resolve_profile`, :func:`parse_engine_info` and
  :class:`LayerPrecision` are plain Python and work everywhere.
* :func:`build_engine` and :class:`TrtRunner` need the ``tensorrt`` Python bindings (10.x or 11.x), an
  NVIDIA GPU and ``cuda-python``; both come with the ``quantdbg[tensorrt]`` extra. Nothing here is
  imported at module import: ``import quantdbg.backends.tensorrt`` works without them, and the first
  use raises :class:`~quantdbg.errors.MissingDependencyError` naming the extra.

Device memory, streams and CUDA events come from **cuda-python** (``cuda.bindings.runtime``, NVIDIA's
official binding of the CUDA runtime API), not from hand-written ctypes and not from
``polygraphy.cuda``. Reasons: it is the binding TensorRT's own Python samples use; it covers events
(``cudaEventRecord``/``cudaEventElapsedTime``), which ``polygraphy.cuda`` lacks, so latency is timed
on the GPU rather than with a host clock; and it reports errors as return codes that this module turns
into :class:`~quantdbg.errors.BackendError`, where Polygraphy's wrapper logs to stdout through its own
logger. Older cuda-python releases expose the same API as ``cuda.cudart``; both are accepted.
"""
from __future__ import annotations

import json
import logging
import re
import statistics
import tempfile
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType, ModuleType
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx

from quantdbg import _optional
from quantdbg._io import write_bytes_atomic
from quantdbg.backends.base import Runner
from quantdbg.data import check_feed
from quantdbg.errors import (
    BackendError,
    ConfigError,
    DataError,
    MissingDependencyError,
    QuantDbgWarning,
    unknown,
)
from quantdbg.model import ModelSource, TensorSpec, input_specs, load_model

if TYPE_CHECKING:
    import tensorrt as trt
else:
    # Resolved on first attribute access, after _tensorrt() has checked the bindings are real.
    trt = _optional.lazy_import("tensorrt", "tensorrt")

_LOG = logging.getLogger(__name__)
_TWO_GB = 2**31 - 1
_MAX_OPT_LEVEL = 5


# --------------------------------------------------------------------------------------------
# Configuration (pure Python)
# --------------------------------------------------------------------------------------------

def _as_shape(value: Sequence[int], what: str) -> tuple[int, ...]:
    shape = tuple(int(d) for d in value)
    if any(d < 0 for d in shape):
        raise ConfigError(f"{what} {shape} has a negative dimension; give concrete sizes (>= 0).")
    return shape


@dataclass(frozen=True)
class ShapeRange:
    """Min/opt/max shapes of one input in an optimization profile.

    Attributes:
        min: Smallest shape the engine accepts.
        opt: Shape TensorRT tunes its kernels for.
        max: Largest shape the engine accepts.
    """

    min: tuple[int, ...]
    opt: tuple[int, ...]
    max: tuple[int, ...]

    def __post_init__(self) -> None:
        shapes = [_as_shape(s, name) for s, name in ((self.min, "min"), (self.opt, "opt"), (self.max, "max"))]
        for name, shape in zip(("min", "opt", "max"), shapes, strict=True):
            object.__setattr__(self, name, shape)
        if len({len(s) for s in shapes}) != 1:
            raise ConfigError(f"ShapeRange ranks differ: min {self.min}, opt {self.opt}, max {self.max}.")
        if any(not lo <= mid <= hi for lo, mid, hi in zip(*shapes, strict=True)):
            raise ConfigError(f"ShapeRange needs min <= opt <= max on every axis, got min {self.min}, "
                              f"opt {self.opt}, max {self.max}.")

    def to_dict(self) -> dict[str, list[int]]:
        """JSON-ready form."""
        return {"min": list(self.min), "opt": list(self.opt), "max": list(self.max)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Sequence[int]]) -> ShapeRange:
        """Inverse of :meth:`to_dict`."""
        return cls(tuple(data["min"]), tuple(data["opt"]), tuple(data["max"]))


def _optional_path(value: str | Path | None) -> Path | None:
    return None if value is None else Path(value)


@dataclass(frozen=True)
class TrtConfig:
    """How a TensorRT engine is built and loaded.

    Precision is not configured here: the network is strongly typed, so INT8 comes from the graph's
    Q/DQ pairs and FP16 from its casts.

    Attributes:
        batch: (min, opt, max) batch size of the optimization profile, used for every input whose
            only dynamic dimension is axis 0.
        shapes: Input name -> explicit :class:`ShapeRange`; needed for inputs with other dynamic
            dimensions (e.g. sequence length), and overrides ``batch``.
        workspace_bytes: Limit of TensorRT's workspace memory pool (None: TensorRT's default).
        builder_optimization_level: 0-5; higher builds longer and may run faster (TensorRT's default 3).
        tf32: Allow TF32 for FP32 layers (TensorRT's default). False gives FP32-faithful float layers.
        timing_cache: Timing-cache file: read before the build when it exists, written after it.
        save_engine: Write the serialized engine here after building.
        load_engine: Deserialize this engine instead of building (the model still supplies the
            input specs that feeds are checked against).
    """

    batch: tuple[int, int, int] = (1, 8, 32)
    shapes: Mapping[str, ShapeRange] = field(default_factory=dict)
    workspace_bytes: int | None = None
    builder_optimization_level: int = 3
    tf32: bool = True
    timing_cache: Path | None = None
    save_engine: Path | None = None
    load_engine: Path | None = None

    def __post_init__(self) -> None:
        batch = tuple(int(b) for b in self.batch)
        if len(batch) != 3 or not 1 <= batch[0] <= batch[1] <= batch[2]:
            raise ConfigError(f"batch must be (min, opt, max) with 1 <= min <= opt <= max, got {self.batch}.")
        object.__setattr__(self, "batch", batch)
        for name, value in self.shapes.items():
            if not isinstance(value, ShapeRange):
                raise ConfigError(f"shapes[{name!r}] must be a ShapeRange, got {type(value).__name__}.")
        object.__setattr__(self, "shapes", MappingProxyType(dict(self.shapes)))
        if self.workspace_bytes is not None and self.workspace_bytes <= 0:
            raise ConfigError(f"workspace_bytes must be > 0 or None, got {self.workspace_bytes}.")
        if not 0 <= self.builder_optimization_level <= _MAX_OPT_LEVEL:
            raise ConfigError(f"builder_optimization_level must be in [0, {_MAX_OPT_LEVEL}], "
                              f"got {self.builder_optimization_level}.")
        for name in ("timing_cache", "save_engine", "load_engine"):
            object.__setattr__(self, name, _optional_path(getattr(self, name)))
        if self.save_engine is not None and self.load_engine is not None:
            raise ConfigError("save_engine and load_engine are both set: a loaded engine is not rebuilt, "
                              "so there is nothing new to save. Set one of them.")

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "batch": list(self.batch),
            "shapes": {name: rng.to_dict() for name, rng in self.shapes.items()},
            "workspace_bytes": self.workspace_bytes,
            "builder_optimization_level": self.builder_optimization_level,
            "tf32": self.tf32,
            **{name: None if getattr(self, name) is None else str(getattr(self, name))
               for name in ("timing_cache", "save_engine", "load_engine")},
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TrtConfig:
        """Inverse of :meth:`to_dict`."""
        return cls(
            batch=(int(data["batch"][0]), int(data["batch"][1]), int(data["batch"][2])),
            shapes={name: ShapeRange.from_dict(rng) for name, rng in data["shapes"].items()},
            workspace_bytes=data["workspace_bytes"],
            builder_optimization_level=data["builder_optimization_level"],
            tf32=data["tf32"],
            timing_cache=_optional_path(data["timing_cache"]),
            save_engine=_optional_path(data["save_engine"]),
            load_engine=_optional_path(data["load_engine"]),
        )


def resolve_profile(inputs: Mapping[str, TensorSpec], shapes: Mapping[str, ShapeRange],
                    batch: tuple[int, int, int]) -> dict[str, ShapeRange]:
    """Works out the optimization-profile range of every input that has a dynamic dimension.

    Args:
        inputs: The model's inputs (:func:`quantdbg.model.input_specs`).
        shapes: Explicit ranges by input name; they win over ``batch``.
        batch: (min, opt, max) batch size for inputs whose only dynamic dimension is axis 0.

    Returns:
        Input name -> range, in input order, for inputs with explicit ranges or dynamic dimensions.

    Raises:
        ConfigError: An explicit range names no input, has the wrong rank or contradicts a fixed
            dimension, or an input has a dynamic dimension other than axis 0 and no explicit range.
    """
    for name in shapes:
        if name not in inputs:
            raise unknown("input", name, inputs, error=ConfigError)
    profile: dict[str, ShapeRange] = {}
    for name, spec in inputs.items():
        if name in shapes:
            profile[name] = _checked_range(spec, shapes[name])
            continue
        dynamic = [axis for axis, dim in enumerate(spec.shape) if not isinstance(dim, int) or dim <= 0]
        if not dynamic:
            continue
        if dynamic != [0]:
            raise ConfigError(
                f"Input {name!r} has shape {_show(spec.shape)} with dynamic axes {dynamic}; only a dynamic "
                f"batch (axis 0) is filled in from batch={batch}. Give its range explicitly, e.g. "
                f"shapes={{{name!r}: ShapeRange(min=..., opt=..., max=...)}}.")
        rest = tuple(d for d in spec.shape[1:] if isinstance(d, int))  # all fixed: only axis 0 is dynamic
        profile[name] = ShapeRange((batch[0], *rest), (batch[1], *rest), (batch[2], *rest))
    return profile


def _checked_range(spec: TensorSpec, rng: ShapeRange) -> ShapeRange:
    if len(rng.min) != len(spec.shape):
        raise ConfigError(f"The range for input {spec.name!r} has rank {len(rng.min)}, but the input has "
                          f"shape {_show(spec.shape)} (rank {len(spec.shape)}).")
    for axis, dim in enumerate(spec.shape):
        if isinstance(dim, int) and dim > 0 and not rng.min[axis] == rng.opt[axis] == rng.max[axis] == dim:
            raise ConfigError(f"The range for input {spec.name!r} sets axis {axis} to "
                              f"{rng.min[axis]}..{rng.max[axis]}, but that axis is fixed at {dim}.")
    return rng


def _show(shape: Sequence[int | str | None]) -> str:
    return "(" + ", ".join("?" if d is None else str(d) for d in shape) + ")"


# --------------------------------------------------------------------------------------------
# Engine inspector JSON -> per-layer precision (pure Python)
# --------------------------------------------------------------------------------------------

# Words TensorRT uses for element types in "Format/Datatype" strings (e.g. "Thirty-two wide channel
# vectorized row major Int8 format", "Row major linear FP32", "Half") and in TensorRT 11's separate
# "DataType" field ("Float", "Int8"). Matched word by word, so "BFloat16" never reads as "Float".
_TYPE_WORDS = {
    "bfloat16": "BF16", "bf16": "BF16", "half": "FP16", "fp16": "FP16", "float": "FP32", "fp32": "FP32",
    "double": "FP64", "int8": "INT8", "uint8": "UINT8", "int32": "INT32", "int64": "INT64",
    "bool": "BOOL", "fp8": "FP8", "int4": "INT4", "fp4": "FP4",
}
UNKNOWN = "unknown"
"""Precision reported when the inspector gives no type (names-only verbosity, dynamic shapes)."""

_ONNX_LAYER = re.compile(r"\[ONNX Layer: (.*?)\](?=[\x1e\x1f]|\[ONNX Layer: |$)", re.DOTALL)


@dataclass(frozen=True)
class LayerPrecision:
    """One engine layer as the engine inspector reports it.

    Attributes:
        name: TensorRT layer name (fused layers join their members with `` + ``).
        layer_type: Kernel family, e.g. ``CaskConvolution``, ``Reformat``, ``kgen``.
        precision: Element type the layer reads (``INT8``, ``FP16``, ``FP32``, ...; ``unknown``),
            taken from its first input as trt-engine-explorer does.
        input_formats: Format/type description of each input.
        output_formats: Format/type description of each output.
        tactic: Kernel name (``TacticName``), else ``TacticValue``, else empty.
        onnx_nodes: ONNX node names from the layer's ``[ONNX Layer: ...]`` metadata.
    """

    name: str
    layer_type: str
    precision: str
    input_formats: tuple[str, ...] = ()
    output_formats: tuple[str, ...] = ()
    tactic: str = ""
    onnx_nodes: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {"name": self.name, "layer_type": self.layer_type, "precision": self.precision,
                "input_formats": list(self.input_formats), "output_formats": list(self.output_formats),
                "tactic": self.tactic, "onnx_nodes": list(self.onnx_nodes)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LayerPrecision:
        """Inverse of :meth:`to_dict`."""
        return cls(data["name"], data["layer_type"], data["precision"], tuple(data["input_formats"]),
                   tuple(data["output_formats"]), data["tactic"], tuple(data["onnx_nodes"]))


def type_of_format(description: str) -> str:
    """Returns the element type named in an inspector format string, or ``"unknown"``.

    Args:
        description: E.g. ``"Channel major INT8 format where channel % 16 == 0"`` or ``"Half"``.

    Returns:
        ``INT8``, ``FP16``, ``FP32``, ``BF16``, ... or ``unknown``.
    """
    for word in re.split(r"[^0-9A-Za-z]+", description):
        found = _TYPE_WORDS.get(word.lower())
        if found:
            return found
    return UNKNOWN


def _tensor_format(tensor: Any) -> str:
    if not isinstance(tensor, Mapping):
        return str(tensor)
    # TensorRT 10: one "Format/Datatype" string; TensorRT 11 splits it into "Format" and "DataType".
    if "Format/Datatype" in tensor:
        return str(tensor["Format/Datatype"])
    parts = [str(tensor[key]) for key in ("DataType", "Format") if key in tensor]
    return " / ".join(parts)


def _layer(entry: Any) -> LayerPrecision:
    if isinstance(entry, str):  # ProfilingVerbosity.LAYER_NAMES_ONLY: names and nothing else
        return LayerPrecision(entry, UNKNOWN, UNKNOWN)
    if not isinstance(entry, Mapping) or "Name" not in entry:
        raise BackendError(f"Engine inspector layer entry is not an object with a 'Name': {entry!r:.200}")
    inputs = tuple(_tensor_format(t) for t in entry.get("Inputs", ()))
    outputs = tuple(_tensor_format(t) for t in entry.get("Outputs", ()))
    typed = [type_of_format(f) for f in inputs + outputs]
    precision = next((t for t in typed if t != UNKNOWN), UNKNOWN)
    tactic = str(entry.get("TacticName") or entry.get("TacticValue") or "")
    nodes = tuple(m.strip() for m in _ONNX_LAYER.findall(str(entry.get("Metadata", ""))))
    return LayerPrecision(str(entry["Name"]), str(entry.get("LayerType", UNKNOWN)), precision,
                          inputs, outputs, tactic, nodes)


def parse_engine_info(text: str) -> tuple[LayerPrecision, ...]:
    """Turns ``EngineInspector.get_engine_information(LayerInformationFormat.JSON)`` into layers.

    Accepts the whole-engine document (``{"Layers": [...], ...}``), a single layer object (from
    ``get_layer_information``) or a bare list of layers, in the TensorRT 10 schema (one
    ``Format/Datatype`` string per tensor) and the TensorRT 11 schema (``DataType`` and ``Format``).

    Args:
        text: The inspector's JSON output.

    Returns:
        One :class:`LayerPrecision` per layer, in engine order.

    Raises:
        BackendError: The text is not JSON or not shaped like inspector output.
    """
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as err:
        raise BackendError(f"Engine inspector output is not JSON ({err}); ask for "
                           "LayerInformationFormat.JSON.") from err
    if isinstance(doc, Mapping) and "Layers" in doc:
        entries = doc["Layers"]
    elif isinstance(doc, Mapping):
        entries = [doc]
    else:
        entries = doc
    if not isinstance(entries, list):
        raise BackendError(f"Engine inspector 'Layers' is a {type(entries).__name__}, expected a list.")
    return tuple(_layer(entry) for entry in entries)


def precision_counts(layers: Sequence[LayerPrecision]) -> dict[str, int]:
    """Counts layers per precision, most common first (ties by name), for summaries."""
    counts: dict[str, int] = {}
    for layer in layers:
        counts[layer.precision] = counts.get(layer.precision, 0) + 1
    return dict(sorted(counts.items(), key=lambda item: (-item[1], item[0])))


# --------------------------------------------------------------------------------------------
# Latency result (pure Python)
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class LatencyResult:
    """GPU time of ``execute_async_v3`` per iteration, measured with CUDA events.

    Host-device copies are excluded: the inputs are copied once before timing.

    Attributes:
        times_ms: One time per timed iteration, in milliseconds.
        input_shapes: Input name -> shape the engine ran with.
    """

    times_ms: tuple[float, ...]
    input_shapes: Mapping[str, tuple[int, ...]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.times_ms:
            raise ConfigError("LatencyResult needs at least one timed iteration.")
        object.__setattr__(self, "times_ms", tuple(float(t) for t in self.times_ms))
        object.__setattr__(self, "input_shapes",
                           MappingProxyType({k: tuple(v) for k, v in self.input_shapes.items()}))

    @property
    def mean_ms(self) -> float:
        """Mean time."""
        return statistics.fmean(self.times_ms)

    @property
    def median_ms(self) -> float:
        """Median time."""
        return statistics.median(self.times_ms)

    @property
    def p90_ms(self) -> float:
        """90th percentile (nearest rank)."""
        ordered = sorted(self.times_ms)
        return ordered[max(0, -(-9 * len(ordered) // 10) - 1)]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form, with the summary statistics for readers."""
        return {"times_ms": list(self.times_ms),
                "input_shapes": {k: list(v) for k, v in self.input_shapes.items()},
                "mean_ms": self.mean_ms, "median_ms": self.median_ms, "p90_ms": self.p90_ms,
                "min_ms": min(self.times_ms), "max_ms": max(self.times_ms)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LatencyResult:
        """Inverse of :meth:`to_dict` (the summary statistics are recomputed)."""
        return cls(tuple(data["times_ms"]), {k: tuple(v) for k, v in data["input_shapes"].items()})


# --------------------------------------------------------------------------------------------
# Optional dependencies
# --------------------------------------------------------------------------------------------

def _tensorrt() -> ModuleType:
    """Imports the TensorRT bindings, refusing a stubs-only ``tensorrt`` namespace package."""
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


def _cudart() -> Any:
    """Imports the CUDA runtime binding of cuda-python (new or old module path)."""
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
        _tensorrt()
        cudart = _cudart()
    except MissingDependencyError as err:
        return str(err)
    status, count = cudart.cudaGetDeviceCount()
    if status != cudart.cudaError_t.cudaSuccess or count < 1:
        return f"No CUDA device is usable (cudaGetDeviceCount: {status}, {count} device(s))."
    return None


def _cuda_check(result: Any, what: str) -> Any:
    """Unpacks a cuda-python ``(error, value...)`` tuple, raising BackendError on failure."""
    cudart = _cudart()
    err, values = (result[0], result[1:]) if isinstance(result, tuple) else (result, ())
    if err != cudart.cudaError_t.cudaSuccess:
        name = getattr(err, "name", str(err))
        raise BackendError(f"CUDA call {what} failed with {name}. Check the GPU, driver and CUDA runtime.")
    return values[0] if len(values) == 1 else values


# --------------------------------------------------------------------------------------------
# Building (needs TensorRT)
# --------------------------------------------------------------------------------------------

class _Logger:
    """Routes TensorRT's messages to :mod:`logging` and keeps the errors for exception messages."""

    def __init__(self) -> None:
        self.errors: list[str] = []
        self.trt_logger = _make_trt_logger(self)

    def log(self, severity: trt.ILogger.Severity, msg: str) -> None:
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


def _make_trt_logger(sink: _Logger) -> trt.ILogger:
    # The subclass is defined here, not at module level, because trt.ILogger only exists once the
    # bindings are imported.
    class _Forward(trt.ILogger):
        def __init__(self) -> None:
            trt.ILogger.__init__(self)

        def log(self, severity: trt.ILogger.Severity, msg: str) -> None:
            sink.log(severity, msg)

    return _Forward()


def _parse(parser: trt.OnnxParser, model: onnx.ModelProto) -> None:
    if model.ByteSize() < _TWO_GB:
        ok = parser.parse(model.SerializeToString())
    else:  # protobuf cannot serialise > 2 GB to bytes; the parser reads external weights from disk
        from quantdbg.model import save_model

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


def build_engine(model: ModelSource, config: TrtConfig = TrtConfig()) -> bytes:
    """Builds a serialized, strongly typed TensorRT engine from a Q/DQ ONNX model.

    Args:
        model: The Q/DQ (and FP16-cast) ONNX model, as a path or ModelProto (never modified).
        config: Profile, workspace, timing cache; ``config.save_engine`` is not used here.

    Returns:
        The serialized engine (plan).

    Raises:
        MissingDependencyError: TensorRT is not installed.
        ModelError: The model does not load or validate.
        ConfigError: The optimization profile cannot be worked out from ``config``.
        BackendError: The ONNX parser rejects nodes (each listed with its name) or the build fails.
    """
    _tensorrt()
    proto = load_model(model, allow_quantized=True)
    logger = _Logger()
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


# --------------------------------------------------------------------------------------------
# Running (needs TensorRT and cuda-python)
# --------------------------------------------------------------------------------------------

class _DeviceBuffer:
    """One device allocation that grows on demand (never shrinks, so shapes can change cheaply)."""

    def __init__(self) -> None:
        self.ptr = 0
        self.nbytes = 0

    def reserve(self, nbytes: int) -> int:
        if nbytes > self.nbytes or not self.ptr:
            self.free()
            self.ptr = int(_cuda_check(_cudart().cudaMalloc(max(nbytes, 1)), "cudaMalloc"))
            self.nbytes = nbytes
        return self.ptr

    def free(self) -> None:
        if self.ptr:
            _cuda_check(_cudart().cudaFree(self.ptr), "cudaFree")
        self.ptr, self.nbytes = 0, 0


class _Session:
    """Everything an active runner owns; :meth:`close` releases it in reverse order of creation."""

    def __init__(self, runtime: trt.Runtime, engine: trt.ICudaEngine, context: trt.IExecutionContext,
                 logger: _Logger, stream: Any) -> None:
        self.runtime = runtime
        self.engine = engine
        self.context = context
        self.logger = logger
        self.stream = stream
        self.buffers: dict[str, _DeviceBuffer] = {}
        # Host arrays of in-flight asynchronous copies, kept alive until the stream is synchronized.
        self.in_flight: dict[str, np.ndarray] = {}

    def buffer(self, name: str) -> _DeviceBuffer:
        """The device buffer of I/O tensor ``name`` (created empty on first use)."""
        return self.buffers.setdefault(name, _DeviceBuffer())

    def close(self) -> None:
        # TensorRT wants the context destroyed before its engine, and the engine before its runtime;
        # the session is discarded after this, so deleting the references frees them in that order.
        del self.context
        del self.engine
        del self.runtime
        for buffer in self.buffers.values():
            buffer.free()
        self.in_flight.clear()
        _cuda_check(_cudart().cudaStreamDestroy(self.stream), "cudaStreamDestroy")


def _dims(dims: trt.Dims) -> tuple[int, ...]:
    return tuple(int(dims[i]) for i in range(len(dims)))


def _numpy_dtype(engine: trt.ICudaEngine, name: str) -> np.dtype[Any]:
    # Spelled out rather than trt.nptype() so that a type NumPy lacks (BF16, FP8, INT4) gets a clear error.
    trt_type = engine.get_tensor_dtype(name)
    known = {trt.DataType.FLOAT: np.float32, trt.DataType.HALF: np.float16, trt.DataType.INT8: np.int8,
             trt.DataType.INT32: np.int32, trt.DataType.INT64: np.int64, trt.DataType.BOOL: np.bool_,
             trt.DataType.UINT8: np.uint8}
    if trt_type not in known:
        raise BackendError(f"Engine tensor {name!r} has TensorRT type {trt_type}, which has no NumPy "
                           "equivalent; keep network inputs and outputs in FP32/FP16/INT8/INT32/INT64/BOOL.")
    return np.dtype(known[trt_type])


class TrtRunner(Runner):
    """Runs a Q/DQ ONNX model with TensorRT (strongly typed, explicit quantization).

    Example::

        with TrtRunner("model_qdq.onnx", TrtConfig(batch=(1, 8, 32))) as runner:
            outputs = runner.infer({"x": x})
            layers = runner.layer_precisions()
            latency = runner.measure_latency({"x": x})

    Args:
        model: The Q/DQ ONNX model (path or ModelProto; never modified).
        config: How to build or load the engine.
    """

    name = "tensorrt"

    def __init__(self, model: ModelSource, config: TrtConfig = TrtConfig()) -> None:
        super().__init__()
        self.model = model
        self.config = config
        self._proto: onnx.ModelProto | None = None
        self._session: _Session | None = None

    def _model(self) -> onnx.ModelProto:
        if self._proto is None:
            self._proto = load_model(self.model, allow_quantized=True)
        return self._proto

    def input_specs(self) -> dict[str, TensorSpec]:
        """The model's inputs, which feeds are checked against."""
        return input_specs(self._model())

    def _activate(self) -> None:
        _tensorrt()
        cudart = _cudart()
        if self.config.load_engine is not None:
            if not self.config.load_engine.is_file():
                raise BackendError(f"Engine file {str(self.config.load_engine)!r} does not exist.")
            plan = self.config.load_engine.read_bytes()
        else:
            plan = build_engine(self._model(), self.config)
            if self.config.save_engine is not None:
                write_bytes_atomic(self.config.save_engine, plan)
        logger = _Logger()
        runtime = trt.Runtime(logger.trt_logger)
        engine = runtime.deserialize_cuda_engine(plan)
        if engine is None:
            raise BackendError(f"TensorRT could not deserialize the engine: {logger.last_errors()}. An "
                               "engine only loads with the TensorRT version and GPU that built it.")
        context = engine.create_execution_context()
        if context is None:
            raise BackendError(f"TensorRT could not create an execution context: {logger.last_errors()}.")
        stream = _cuda_check(cudart.cudaStreamCreate(), "cudaStreamCreate")
        self._session = _Session(runtime, engine, context, logger, stream)

    def _deactivate(self) -> None:
        if self._session is not None:
            self._session.close()
        self._session = None

    def _active(self) -> _Session:
        if self._session is None:
            raise BackendError("tensorrt: call activate() (or use `with`) first.")
        return self._session

    def _tensor_names(self, mode: trt.TensorIOMode) -> list[str]:
        engine = self._active().engine
        names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
        return [name for name in names if engine.get_tensor_mode(name) == mode]

    def _prepare(self, feed: Mapping[str, np.ndarray]) -> dict[str, tuple[int, ...]]:
        """Sets input shapes, copies inputs to the device and binds every I/O address.

        Returns:
            Output name -> shape for these inputs.
        """
        session, cudart = self._active(), _cudart()
        kind = cudart.cudaMemcpyKind.cudaMemcpyHostToDevice
        for name in self._tensor_names(trt.TensorIOMode.INPUT):
            host = np.ascontiguousarray(feed[name], dtype=_numpy_dtype(session.engine, name))
            if not session.context.set_input_shape(name, tuple(host.shape)):
                profile = [_dims(d) for d in session.engine.get_tensor_profile_shape(name, 0)]
                raise BackendError(
                    f"Input {name!r} has shape {host.shape}, outside the engine's optimization profile "
                    f"{profile} (min, opt, max). Rebuild with a TrtConfig whose batch/shapes cover it.")
            ptr = session.buffer(name).reserve(host.nbytes)
            _cuda_check(cudart.cudaMemcpyAsync(ptr, host.ctypes.data, host.nbytes, kind, session.stream),
                        "cudaMemcpyAsync (host to device)")
            session.context.set_tensor_address(name, ptr)
            session.in_flight[name] = host
        shapes = {}
        for name in self._tensor_names(trt.TensorIOMode.OUTPUT):
            shape = _dims(session.context.get_tensor_shape(name))
            if any(d < 0 for d in shape):
                raise BackendError(f"Output {name!r} has a data-dependent shape {shape}; this runner needs "
                                   "output shapes that follow from the input shapes.")
            nbytes = int(np.prod(shape, dtype=np.int64)) * _numpy_dtype(session.engine, name).itemsize
            session.context.set_tensor_address(name, session.buffer(name).reserve(nbytes))
            shapes[name] = shape
        return shapes

    def _execute(self) -> None:
        session = self._active()
        if not session.context.execute_async_v3(int(session.stream)):
            raise BackendError(f"TensorRT execute_async_v3 failed: {session.logger.last_errors()}.")

    def _infer(self, feed: dict[str, np.ndarray], outputs: list[str] | None) -> dict[str, np.ndarray]:
        session, cudart = self._active(), _cudart()
        shapes = self._prepare(feed)
        wanted = list(shapes) if outputs is None else list(outputs)
        for name in wanted:
            if name not in shapes:
                raise unknown("output", name, shapes, error=DataError)
        self._execute()
        kind = cudart.cudaMemcpyKind.cudaMemcpyDeviceToHost
        results = {}
        for name in wanted:
            host = np.empty(shapes[name], dtype=_numpy_dtype(session.engine, name))
            _cuda_check(cudart.cudaMemcpyAsync(host.ctypes.data, session.buffers[name].ptr, host.nbytes, kind,
                                               session.stream), "cudaMemcpyAsync (device to host)")
            results[name] = host
        _cuda_check(cudart.cudaStreamSynchronize(session.stream), "cudaStreamSynchronize")
        session.in_flight.clear()
        return results

    def measure_latency(self, feed: Mapping[str, np.ndarray], iterations: int = 100,
                        warmup: int = 10) -> LatencyResult:
        """Times the engine on ``feed`` with CUDA events around each ``execute_async_v3``.

        Args:
            feed: One checked feed; its shapes select the profile point that is timed.
            iterations: Timed runs.
            warmup: Untimed runs first (the first run after a shape change is slower).

        Returns:
            The per-iteration GPU times.

        Raises:
            ConfigError: ``iterations`` < 1 or ``warmup`` < 0.
            BackendError: The runner is not active or a CUDA/TensorRT call failed.
            DataError: The feed does not match the model's inputs.
        """
        if iterations < 1 or warmup < 0:
            raise ConfigError(f"iterations must be >= 1 and warmup >= 0, got {iterations} and {warmup}.")
        session, cudart = self._active(), _cudart()
        checked = check_feed(feed, self.input_specs())
        self._prepare(checked)
        for _ in range(warmup):
            self._execute()
        start = _cuda_check(cudart.cudaEventCreate(), "cudaEventCreate")
        end = _cuda_check(cudart.cudaEventCreate(), "cudaEventCreate")
        times = []
        try:
            for _ in range(iterations):
                _cuda_check(cudart.cudaEventRecord(start, session.stream), "cudaEventRecord")
                self._execute()
                _cuda_check(cudart.cudaEventRecord(end, session.stream), "cudaEventRecord")
                _cuda_check(cudart.cudaEventSynchronize(end), "cudaEventSynchronize")
                elapsed = _cuda_check(cudart.cudaEventElapsedTime(start, end), "cudaEventElapsedTime")
                times.append(float(elapsed))
        finally:
            cudart.cudaEventDestroy(start)
            cudart.cudaEventDestroy(end)
            session.in_flight.clear()
        return LatencyResult(tuple(times), {name: tuple(a.shape) for name, a in checked.items()})

    def layer_precisions(self) -> tuple[LayerPrecision, ...]:
        """Each engine layer's precision, formats and tactic, from the engine inspector.

        With dynamic shapes the inspector only reports formats for concrete shapes, so if no input
        shape has been set yet (no ``infer`` so far) the profile's opt shapes are set first.

        Returns:
            The layers in engine order (see :func:`parse_engine_info`).

        Raises:
            BackendError: The runner is not active.
        """
        session = self._active()
        for name in self._tensor_names(trt.TensorIOMode.INPUT):
            if any(d < 0 for d in _dims(session.context.get_tensor_shape(name))):
                opt = session.engine.get_tensor_profile_shape(name, 0)[1]
                session.context.set_input_shape(name, opt)
        inspector = session.engine.create_engine_inspector()
        inspector.execution_context = session.context
        return parse_engine_info(inspector.get_engine_information(trt.LayerInformationFormat.JSON))
