"""SmoothQuant-style migration of activation outliers into weights (Xiao et al., 2023).

A MatMul ``Y = X @ W`` equals ``(X / s) @ (s * W)`` for any positive per-input-channel vector
``s`` (``W``'s rows scaled by ``s``). Choosing ``s_j = max|X_j|^alpha / max|W_j|^(1 - alpha)``
flattens the activation channels that carry outliers (GELU outputs, LayerNorm outputs) at the
price of wider weight rows; weights are quantized per output channel, so they absorb it far better
than a per-tensor activation scale does. The FP32 function is unchanged.

``1/s`` goes where it costs nothing when the graph allows it: into the gamma/beta of a preceding
LayerNormalization, the constant of a preceding Mul/Div, or the columns (and bias) of a preceding
MatMul -- legal only when every reader of the activation is smoothed with the same ``s`` (shape
readers aside). Otherwise an explicit ``Mul`` by ``1/s`` is inserted in front of the smoothed
nodes only. The Q/DQ pair then lands on the Mul's output, so the Mul runs in FP16/FP32 just
before a QuantizeLinear; TensorRT's pointwise fusion can merge the two (or the Mul into its
producer), and at worst it is one cheap elementwise kernel.

Typical use::

    result = smooth(model, "calib.npz", SmoothingConfig(alpha=0.8))
    qmodel = quantdbg.quantize(result.model, "calib.npz", CalibConfig("minmax"))
"""
from __future__ import annotations

import fnmatch
import logging
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from types import MappingProxyType
from typing import Any, Literal, get_args

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from quantdbg._progress import track
from quantdbg.calibration.stats import check_activations, expose_tensors, open_session, run_batch
from quantdbg.data import DEFAULT_BATCH_SIZE as DEFAULT_BATCH_SIZE  # still importable from here
from quantdbg.data import DataSource, as_data, as_model_data, check_feed, samples_in
from quantdbg.errors import ConfigError, DataError, ModelError, QuantDbgWarning, unknown
from quantdbg.model import (
    ModelSource,
    UniqueNames,
    as_loaded,
    constant_values,
    input_specs,
    to_graph,
    to_model,
)

logger = logging.getLogger(__name__)

SmoothOp = Literal["MatMul", "Gemm"]
Placement = Literal["layernorm", "scale_constant", "bias_matmul", "matmul", "explicit_mul"]
"""Where ``1/s`` went: a LayerNormalization's gamma/beta, a Mul/Div constant, the columns and
bias of a MatMul+Add, the columns of a MatMul, or an inserted Mul."""

_SHAPE_ONLY_OPS = frozenset({"Shape", "Size"})  # read only the shape, which smoothing keeps
_FLOAT = np.dtype(np.float32)
_TWO_GB = 2**31 - 1


@dataclass(frozen=True)
class SmoothingConfig:
    """What to smooth and how hard.

    Attributes:
        alpha: Migration strength in [0, 1]: at 1, ``s_j = max|X_j|`` flattens every activation
            channel to max 1 and the weights take the whole range; at 0, ``s_j = 1/max|W_j|``
            flattens the weight rows instead. 0.5 is SmoothQuant's default; when the weights have
            outlier rows of their own (``Migration.weight_outlier_before`` above
            ``act_outlier_before``), a larger alpha keeps them out of the activations -- with
            per-channel weight scales, MiniLM-L6 did best at 0.8-0.9 (benchmarks/RESULTS.md).
        op_types: Op types to smooth; their input 0 is the activation, input 1 an initializer
            weight (Gemm with ``transA=0``).
        nodes: Node-name globs to smooth (default: every node of ``op_types``).
        exclude: Node-name globs never smoothed (wins over ``nodes``).
        fold: Fold ``1/s`` into a preceding LayerNormalization, Mul/Div constant or MatMul where
            legal; False always inserts an explicit Mul.
        max_scale: ``s`` is clipped to ``[1/max_scale, max_scale]`` so a near-empty channel
            cannot blow a weight row up.
        max_batches: Use at most this many calibration feeds (None: all).
    """

    alpha: float = 0.5
    op_types: tuple[SmoothOp, ...] = ("MatMul", "Gemm")
    nodes: tuple[str, ...] = ("*",)
    exclude: tuple[str, ...] = ()
    fold: bool = True
    max_scale: float = 1e4
    max_batches: int | None = None

    def __post_init__(self) -> None:
        for name in ("op_types", "nodes", "exclude"):
            value = getattr(self, name)
            if isinstance(value, str):
                raise ConfigError(f"SmoothingConfig.{name} takes a sequence of strings, not one string "
                                  f"({value!r}); write ({value!r},).")
            object.__setattr__(self, name, tuple(value))
        if not 0.0 <= self.alpha <= 1.0:
            raise ConfigError(f"SmoothingConfig.alpha must be in [0, 1], got {self.alpha}.")
        bad = [op for op in self.op_types if op not in get_args(SmoothOp)]
        if bad or not self.op_types:
            raise ConfigError(f"SmoothingConfig.op_types must be a non-empty subset of {get_args(SmoothOp)}, "
                              f"got {self.op_types}.")
        if not self.nodes:
            raise ConfigError("SmoothingConfig.nodes is empty: nothing would be smoothed; use ('*',).")
        if not self.max_scale >= 1.0:
            raise ConfigError(f"SmoothingConfig.max_scale must be >= 1, got {self.max_scale}.")
        if self.max_batches is not None and self.max_batches < 1:
            raise ConfigError(f"SmoothingConfig.max_batches must be >= 1 or None, got {self.max_batches}.")

    def selects(self, node_name: str) -> bool:
        """True when ``node_name`` matches ``nodes`` and no ``exclude`` glob."""
        match = any(fnmatch.fnmatchcase(node_name, p) for p in self.nodes)
        return match and not any(fnmatch.fnmatchcase(node_name, p) for p in self.exclude)

    def to_dict(self) -> dict[str, Any]:
        """Returns the settings as JSON-ready data."""
        data = asdict(self)
        for name in ("op_types", "nodes", "exclude"):
            data[name] = list(data[name])
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SmoothingConfig:
        """Rebuilds the settings from :meth:`to_dict` output."""
        values = dict(data)
        for name in ("op_types", "nodes", "exclude"):
            if name in values:
                values[name] = tuple(values[name])
        return cls(**values)


@dataclass(frozen=True)
class Migration:
    """One smoothing factor ``s``, shared by every node that reads one activation tensor.

    Attributes:
        nodes: The smoothed nodes (their names are unchanged in the smoothed model).
        tensor: The activation tensor they read in the original model.
        smoothed_tensor: The tensor they read in the smoothed model (``tensor`` itself when
            ``1/s`` was folded upstream, the inserted Mul's output otherwise); per-tensor
            calibrator globs must match this name.
        weights: Original names of the weight initializers whose rows were multiplied by ``s``.
        placement: Where ``1/s`` went.
        folded_into: The producer node that absorbed ``1/s``, or the name of the inserted Mul.
        channels: Number of input channels (length of ``s``).
        alpha: Migration strength used.
        scale_min: Smallest ``s_j``.
        scale_max: Largest ``s_j``.
        scale_geomean: Geometric mean of ``s``.
        act_absmax_before: max |x| of the activation over all channels, before.
        act_absmax_after: The same after dividing by ``s``.
        act_outlier_before: Largest channel max|x| over the median channel, before.
        act_outlier_after: The same after smoothing (1.0 is perfectly flat).
        weight_absmax_before: max |w| over the smoothed weights, before.
        weight_absmax_after: The same after multiplying the rows by ``s``.
        weight_outlier_before: Largest input-channel (row) max|w| over the median row, before. When
            it exceeds ``act_outlier_before`` the weights carry outliers of their own, and a small
            alpha moves them into the activation.
        weight_outlier_after: The same after smoothing.
    """

    nodes: tuple[str, ...]
    tensor: str
    smoothed_tensor: str
    weights: tuple[str, ...]
    placement: Placement
    folded_into: str
    channels: int
    alpha: float
    scale_min: float
    scale_max: float
    scale_geomean: float
    act_absmax_before: float
    act_absmax_after: float
    act_outlier_before: float
    act_outlier_after: float
    weight_absmax_before: float
    weight_absmax_after: float
    weight_outlier_before: float
    weight_outlier_after: float

    def to_dict(self) -> dict[str, Any]:
        """Returns the migration as JSON-ready data."""
        data = asdict(self)
        data["nodes"], data["weights"] = list(self.nodes), list(self.weights)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Migration:
        """Rebuilds a migration from :meth:`to_dict` output."""
        values = dict(data)
        values["nodes"], values["weights"] = tuple(values["nodes"]), tuple(values["weights"])
        return cls(**values)


@dataclass(frozen=True)
class SkippedNode:
    """A node of a smoothed op type that was left as it was.

    Attributes:
        node: Node name.
        reason: Why, e.g. its weight is not an initializer (attention's ``Q @ K^T``).
    """

    node: str
    reason: str

    def to_dict(self) -> dict[str, Any]:
        """Returns the entry as JSON-ready data."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SkippedNode:
        """Rebuilds the entry from :meth:`to_dict` output."""
        return cls(**data)


@dataclass(frozen=True)
class SmoothingResult:
    """The smoothed FP32 model and the record of every migration.

    Attributes:
        model: The smoothed FP32 model; its outputs equal the original's to float rounding.
        migrations: One entry per smoothed activation tensor, in graph order.
        skipped: Nodes of a smoothed op type that were not smoothed, with the reason.
        config: The settings used.
        n_batches: Calibration feeds consumed to measure the activations.
        n_samples: Samples in those feeds.
    """

    model: onnx.ModelProto = field(compare=False)
    migrations: tuple[Migration, ...]
    skipped: tuple[SkippedNode, ...] = ()
    config: SmoothingConfig = field(default_factory=SmoothingConfig)
    n_batches: int = 0
    n_samples: int = 0

    @property
    def nodes(self) -> tuple[str, ...]:
        """Every smoothed node, in graph order."""
        return tuple(name for m in self.migrations for name in m.nodes)

    def migration_of(self, node: str) -> Migration:
        """The migration that smoothed ``node``.

        Raises:
            ModelError: ``node`` was not smoothed (close names are suggested).
        """
        for migration in self.migrations:
            if node in migration.nodes:
                return migration
        raise unknown("smoothed node", node, self.nodes)

    def to_dict(self) -> dict[str, Any]:
        """Returns the provenance (not the model bytes) as JSON-ready data."""
        return {"migrations": [m.to_dict() for m in self.migrations],
                "skipped": [s.to_dict() for s in self.skipped], "config": self.config.to_dict(),
                "n_batches": self.n_batches, "n_samples": self.n_samples}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], model: onnx.ModelProto) -> SmoothingResult:
        """Rebuilds a result from :meth:`to_dict` output and the smoothed model it describes."""
        return cls(model, tuple(Migration.from_dict(m) for m in data["migrations"]),
                   tuple(SkippedNode.from_dict(s) for s in data.get("skipped", ())),
                   SmoothingConfig.from_dict(data["config"]), int(data["n_batches"]), int(data["n_samples"]))


@dataclass(frozen=True)
class ChannelAbsmax:
    """Per-channel max |x| (channels on the last axis) of activation tensors.

    Attributes:
        absmax: Tensor name -> float64 vector of max |x| per channel, over every finite value.
        nonfinite: Tensor name -> NaN/Inf values seen (left out of ``absmax``).
        n_batches: Feeds consumed.
        n_samples: Samples consumed (axis 0 of the first input, summed).
    """

    absmax: Mapping[str, np.ndarray]
    nonfinite: Mapping[str, int]
    n_batches: int
    n_samples: int


# --------------------------------------------------------------------------------------------
# Public entry points
# --------------------------------------------------------------------------------------------

_DEFAULT = SmoothingConfig()


def smooth(model: ModelSource, data: DataSource, config: SmoothingConfig = _DEFAULT, *,
           batch_size: int | None = None, progress: bool = False,
           session_options: Any = None) -> SmoothingResult:
    """Migrates activation outliers into the weights of MatMul/Gemm nodes.

    One streamed ONNX Runtime pass measures each smoothed activation's per-channel max |x|
    (nothing per sample is kept), then :func:`apply_smoothing` rewrites a copy of the model.

    Args:
        model: FP32 model path or ModelProto (never modified).
        data: Calibration data (``.npz`` path, arrays, or feeds; see :func:`quantdbg.data.as_data`).
        config: Strength, node selection and folding.
        batch_size: Samples per feed for ``.npz`` paths and arrays (default 32); the result
            does not depend on it.
        progress: Show a progress bar.
        session_options: ``onnxruntime.SessionOptions`` for the measuring session.

    Returns:
        The smoothed FP32 model and one :class:`Migration` per smoothed activation tensor.

    Raises:
        ModelError: The model is invalid or already quantized, or a ``nodes``/``exclude`` glob
            matches no node.
        DataError: The data is empty or does not match the model's inputs.
        BackendError: ONNX Runtime failed.
    """
    loaded = as_loaded(model)
    feeds = as_model_data(data, loaded.proto, batch_size)
    measured = collect_channel_absmax(loaded, feeds, smoothing_targets(loaded, config),
                                      max_batches=config.max_batches, progress=progress,
                                      session_options=session_options)
    result = apply_smoothing(loaded, measured.absmax, config)
    return SmoothingResult(result.model, result.migrations, result.skipped, config,
                           measured.n_batches, measured.n_samples)


def smoothing_targets(model: ModelSource, config: SmoothingConfig = _DEFAULT) -> tuple[str, ...]:
    """The activation tensors whose per-channel ranges :func:`apply_smoothing` needs, in graph order.

    Args:
        model: FP32 model path or ModelProto (never modified).
        config: Node selection.

    Returns:
        One tensor per group of selected nodes reading it.

    Raises:
        ModelError: The model is invalid or a ``nodes``/``exclude`` glob matches no node.
    """
    groups, _ = _plan(to_graph(as_loaded(model).proto), config)
    return tuple(g.tensor.name for g in groups)


def apply_smoothing(model: ModelSource, act_absmax: Mapping[str, np.ndarray],
                    config: SmoothingConfig = _DEFAULT) -> SmoothingResult:
    """Rewrites a copy of ``model`` with given per-channel activation ranges.

    Args:
        model: FP32 model path or ModelProto (never modified).
        act_absmax: Activation tensor name -> per-channel max |x| (last axis), for every
            activation read by a selected node (e.g. from :func:`collect_channel_absmax`).
        config: Strength, node selection and folding.

    Returns:
        The smoothed model and its migrations (``n_batches`` 0: nothing was measured here).

    Raises:
        ModelError: The model is invalid, a glob matches no node, or a vector's length differs
            from the weight's input channels.
        DataError: A selected activation has no entry in ``act_absmax``.
    """
    loaded = as_loaded(model).proto
    graph = to_graph(loaded)
    groups, skipped = _plan(graph, config)
    names = UniqueNames.of_graph(graph)
    outputs = {t.name for t in graph.outputs}
    migrations = []
    for group in groups:
        absmax = _absmax_for(group, act_absmax)
        migrations.append(_migrate(graph, group, absmax, config, outputs, names))
    smoothed = to_model(graph, like=loaded)
    if smoothed.ByteSize() < _TWO_GB:  # protobuf cannot check or infer >2 GB in memory; ORT infers later
        try:
            onnx.checker.check_model(smoothed)
            smoothed = onnx.shape_inference.infer_shapes(smoothed)
        except Exception as err:  # a bug in quantdbg, not a user error
            raise AssertionError(f"smoothing produced an invalid ONNX model: {err}") from err
    return SmoothingResult(smoothed, tuple(migrations), tuple(skipped), config)


def smoothing_scales(act_absmax: np.ndarray, weight_absmax: np.ndarray, alpha: float,
                     max_scale: float = 1e4) -> np.ndarray:
    """``s_j = max|X_j|^alpha / max|W_j|^(1-alpha)``, clipped to ``[1/max_scale, max_scale]``.

    A channel whose activation or weight range is zero keeps ``s_j = 1`` (there is nothing to
    balance, and a zero would divide).

    Args:
        act_absmax: Per-channel max |x| of the activation.
        weight_absmax: Per-input-channel (row) max |w| over every weight reading it.
        alpha: Migration strength in [0, 1].
        max_scale: Clip bound (>= 1).

    Returns:
        float32 vector ``s``.

    Raises:
        ModelError: The two vectors differ in length.
    """
    act = np.asarray(act_absmax, np.float64)
    weight = np.asarray(weight_absmax, np.float64)
    if act.shape != weight.shape:
        raise ModelError(f"Activation ranges cover {act.shape} channels but the weights have {weight.shape} "
                         "input channels; they must match.")
    valid = (act > 0) & (weight > 0) & np.isfinite(act) & np.isfinite(weight)
    scale = np.ones_like(act)
    scale[valid] = act[valid] ** alpha / weight[valid] ** (1.0 - alpha)
    return np.clip(scale, 1.0 / max_scale, max_scale).astype(np.float32)


def collect_channel_absmax(model: ModelSource, data: DataSource, tensors: Iterable[str], *,
                           max_batches: int | None = None, progress: bool = False,
                           session_options: Any = None) -> ChannelAbsmax:
    """Streams ``data`` through ``model`` and keeps each tensor's per-channel max |x|.

    Channels are the last axis. Each batch is reduced to one vector per tensor and dropped, so
    memory does not grow with the number of samples, and the result (a max) does not depend on
    batching or order.

    Args:
        model: Path or ModelProto (never modified; a copy exposes the tensors as outputs).
        data: Feeds (see :func:`quantdbg.data.as_data`); iterated once.
        tensors: Value names (graph inputs allowed).
        max_batches: Stop after this many feeds (None: all).
        progress: Show a progress bar.
        session_options: ``onnxruntime.SessionOptions``.

    Returns:
        Per-channel max |x| and NaN/Inf counts per tensor, with batch and sample counts.

    Raises:
        ModelError: A tensor name is unknown or names an initializer.
        DataError: A feed does not match the model, a tensor is not float or changes its channel
            count, or there is no data.
        BackendError: ONNX Runtime failed.
    """
    loaded = as_loaded(model).proto
    names = list(dict.fromkeys(tensors))
    check_activations(loaded, names, "; per-channel ranges are measured on activations only "
                      "(a weight's range comes from its values).")
    specs = input_specs(loaded)
    fetch = [n for n in names if n not in specs]
    session = open_session(expose_tensors(loaded, fetch), session_options, "smoothing") if fetch else None
    absmax: dict[str, np.ndarray] = {}
    nonfinite = dict.fromkeys(names, 0)
    n_batches = n_samples = 0
    feeds = as_data(data, inputs=list(specs))
    for index, feed in enumerate(track(_first(feeds, max_batches), desc="smoothing", enabled=progress)):
        checked = check_feed(feed, specs, where=f"calibration batch {index}")
        fetched = dict(zip(fetch, run_batch(session, fetch, checked, index), strict=True))
        for name in names:
            array = checked[name] if name in specs else fetched[name]
            _reduce_into(absmax, nonfinite, name, array)
        n_batches += 1
        n_samples += samples_in(checked)
    if n_batches == 0:
        raise DataError("The calibration data yielded no batches; give at least one feed.")
    for name, count in nonfinite.items():
        if count:
            warnings.warn(f"Tensor {name!r}: {count} NaN/Inf value(s) were left out of its per-channel "
                          "ranges. Check the model and the calibration data.", QuantDbgWarning, stacklevel=2)
    return ChannelAbsmax(MappingProxyType(absmax), MappingProxyType(nonfinite), n_batches, n_samples)


# --------------------------------------------------------------------------------------------
# Measuring
# --------------------------------------------------------------------------------------------

def _first(feeds: Iterable[Any], limit: int | None) -> Iterable[Any]:
    for index, feed in enumerate(feeds):
        if limit is not None and index >= limit:
            return
        yield feed


def _reduce_into(absmax: dict[str, np.ndarray], nonfinite: dict[str, int], name: str,
                 array: np.ndarray) -> None:
    """Folds one batch of ``name`` into its per-channel max |x| (channels on the last axis)."""
    array = np.asarray(array)
    if not np.issubdtype(array.dtype, np.floating) or array.ndim == 0:
        raise DataError(f"Tensor {name!r} holds {array.dtype} values of shape {array.shape}; only float "
                        "tensors with a channel axis can be smoothed.")
    flat = array.reshape(-1, array.shape[-1])
    # max and -min avoid materialising |x| (one temporary the size of the batch per tensor).
    batch = np.maximum(flat.max(axis=0), -flat.min(axis=0)).astype(np.float64)
    if not np.all(np.isfinite(batch)):
        finite = np.isfinite(flat)
        nonfinite[name] += int(finite.size - np.count_nonzero(finite))
        batch = np.where(finite, np.abs(flat), 0.0).max(axis=0).astype(np.float64)
    previous = absmax.get(name)
    if previous is not None and previous.shape != batch.shape:
        raise DataError(f"Tensor {name!r} had {previous.shape[0]} channels (last axis) in earlier batches "
                        f"and {batch.shape[0]} now; its channel count must be fixed to be smoothed.")
    absmax[name] = batch if previous is None else np.maximum(previous, batch)


# --------------------------------------------------------------------------------------------
# Planning
# --------------------------------------------------------------------------------------------

@dataclass
class _Group:
    """The selected nodes reading one activation tensor; they share one ``s``."""

    tensor: gs.Tensor
    nodes: list[gs.Node]
    channels: int


def _plan(graph: gs.Graph, config: SmoothingConfig) -> tuple[list[_Group], list[SkippedNode]]:
    """Groups the selected nodes by the activation they read, in graph order."""
    _check_globs(graph, config)
    groups: dict[str, _Group] = {}
    skipped: list[SkippedNode] = []
    for node in graph.nodes:
        if node.op not in config.op_types or not config.selects(node.name):
            continue
        channels, reason = _weight_channels(node)
        if reason is None:
            group = groups.setdefault(node.inputs[0].name, _Group(node.inputs[0], [], channels))
            if group.channels != channels:
                reason = (f"its weight has {channels} input channels but other nodes reading "
                          f"{node.inputs[0].name!r} have {group.channels}")
            else:
                group.nodes.append(node)
        if reason is not None:
            skipped.append(SkippedNode(node.name, reason))
    return list(groups.values()), skipped


def _check_globs(graph: gs.Graph, config: SmoothingConfig) -> None:
    names = [node.name for node in graph.nodes]
    for field_name in ("nodes", "exclude"):
        for pattern in getattr(config, field_name):
            if not any(fnmatch.fnmatchcase(name, pattern) for name in names):
                err = unknown("node", pattern, names)
                raise ModelError(f"SmoothingConfig.{field_name} entry {pattern!r} matches no node. {err}")


def _weight_channels(node: gs.Node) -> tuple[int, str | None]:
    """(input channels K, None) for a smoothable node, else (0, why not)."""
    if len(node.inputs) < 2:
        return 0, "it has fewer than two inputs"
    act, weight = node.inputs[0], node.inputs[1]
    if constant_values(act) is not None:
        return 0, "input 0 is a constant, not an activation"
    values = constant_values(weight)
    if values is None:
        return 0, f"input 1 ({weight.name!r}) is not an initializer (an activation-by-activation product)"
    if values.dtype != _FLOAT or values.ndim != 2:
        return 0, (f"weight {weight.name!r} is {values.dtype} of rank {values.ndim}; "
                   "only 2-D float32 weights are smoothed")
    if act.dtype is not None and not _is_float32(act):
        return 0, f"activation {act.name!r} is not float32"
    if node.op == "Gemm" and node.attrs.get("transA", 0):
        return 0, "Gemm with transA=1 (its channels are not on the last axis)"
    k = values.shape[1] if node.op == "Gemm" and node.attrs.get("transB", 0) else values.shape[0]
    last = act.shape[-1] if act.shape else None
    if isinstance(last, int) and last != k:
        return 0, f"activation {act.name!r} has {last} channels but weight {weight.name!r} expects {k}"
    return int(k), None


def _is_float32(tensor: gs.Tensor) -> bool:
    try:
        return np.dtype(tensor.dtype) == _FLOAT
    except TypeError:  # gs keeps dtypes NumPy lacks as onnx enums
        return False


def _row_axis(node: gs.Node) -> int:
    """Axis of the weight that indexes input channels."""
    return 1 if node.op == "Gemm" and node.attrs.get("transB", 0) else 0


# --------------------------------------------------------------------------------------------
# Rewriting
# --------------------------------------------------------------------------------------------

def _absmax_for(group: _Group, act_absmax: Mapping[str, np.ndarray]) -> np.ndarray:
    name = group.tensor.name
    if name not in act_absmax:
        raise DataError(f"No per-channel range for activation {name!r} (read by {group.nodes[0].name!r}); "
                        "measure it with collect_channel_absmax() or call smooth().")
    absmax = np.asarray(act_absmax[name], np.float64)
    if absmax.shape != (group.channels,):
        raise ModelError(f"The range of activation {name!r} has shape {absmax.shape}, but node "
                         f"{group.nodes[0].name!r} has {group.channels} input channels.")
    return absmax


def _migrate(graph: gs.Graph, group: _Group, absmax: np.ndarray, config: SmoothingConfig,
             outputs: set[str], names: UniqueNames) -> Migration:
    """Computes ``s`` for one group, moves ``1/s`` upstream and scales the weight rows."""
    weights = _unique_weights(group)
    w_rows = np.max([_row_absmax(values, axis) for _, values, axis in weights], axis=0)
    scale = smoothing_scales(absmax, w_rows, config.alpha, config.max_scale)
    tensor = group.tensor  # read before the rewrite rewires the nodes
    folded = _fold(group, scale, outputs, names) if config.fold else None
    placement, where = folded if folded is not None else _insert_mul(graph, group, scale, names)
    smoothed_tensor = group.nodes[0].inputs[0].name
    for weight, values, axis in weights:
        shape = [1, 1]
        shape[axis] = -1
        users = [(n, 1) for n in group.nodes if n.inputs[1] is weight]
        _replace_constant(weight, values * scale.reshape(shape), users, names)
    after = absmax / scale
    logger.debug("smoothed %s (%s into %s)", tensor.name, placement, where)
    return Migration(
        nodes=tuple(n.name for n in group.nodes), tensor=tensor.name, smoothed_tensor=smoothed_tensor,
        weights=tuple(w.name for w, _, _ in weights), placement=placement, folded_into=where,
        channels=group.channels, alpha=config.alpha, scale_min=float(scale.min()),
        scale_max=float(scale.max()), scale_geomean=float(np.exp(np.log(scale.astype(np.float64)).mean())),
        act_absmax_before=float(absmax.max()), act_absmax_after=float(after.max()),
        act_outlier_before=_outlier_ratio(absmax), act_outlier_after=_outlier_ratio(after),
        weight_absmax_before=float(w_rows.max()), weight_absmax_after=float((w_rows * scale).max()),
        weight_outlier_before=_outlier_ratio(w_rows), weight_outlier_after=_outlier_ratio(w_rows * scale))


def _unique_weights(group: _Group) -> list[tuple[gs.Tensor, np.ndarray, int]]:
    seen: dict[int, tuple[gs.Tensor, np.ndarray, int]] = {}
    for node in group.nodes:
        weight = node.inputs[1]
        if id(weight) not in seen:
            seen[id(weight)] = (weight, np.asarray(constant_values(weight), np.float32), _row_axis(node))
    return list(seen.values())


def _row_absmax(values: np.ndarray, axis: int) -> np.ndarray:
    return np.abs(values).max(axis=1 - axis).astype(np.float64)


def _outlier_ratio(absmax: np.ndarray) -> float:
    """Largest channel range over the median one (channels that never moved left out)."""
    live = absmax[absmax > 0]
    return float(live.max() / np.median(live)) if live.size else 1.0


def _insert_mul(graph: gs.Graph, group: _Group, scale: np.ndarray,
                names: UniqueNames) -> tuple[Placement, str]:
    """Inserts ``x * (1/s)`` feeding only the group's nodes; returns the placement and Mul name."""
    tensor = group.tensor
    base = f"{tensor.name}/smooth"
    inverse = gs.Constant(names(f"{base}/inv_scale"), (np.float32(1.0) / scale).astype(np.float32))
    out = gs.Variable(names(f"{base}/output"), np.float32, tensor.shape)
    mul = gs.Node("Mul", names(f"{base}/Mul"), inputs=[tensor, inverse], outputs=[out])
    for node in group.nodes:
        node.inputs[0] = out
    graph.nodes.append(mul)  # to_model() toposorts
    return "explicit_mul", mul.name


def _fold(group: _Group, scale: np.ndarray, outputs: set[str],
          names: UniqueNames) -> tuple[Placement, str] | None:
    """Divides the producer of the group's activation by ``s`` when that is legal; else None."""
    tensor = group.tensor
    if tensor.name in outputs or len(tensor.inputs) != 1:
        return None  # a graph output or input must keep its values
    members = {id(n) for n in group.nodes}
    if any(id(c) not in members and c.op not in _SHAPE_ONLY_OPS for c in tensor.outputs):
        return None  # another reader needs the unscaled values
    producer = tensor.inputs[0]
    folders = {"LayerNormalization": _fold_layernorm, "Mul": _fold_scale_constant,
               "Div": _fold_scale_constant, "Add": _fold_bias_matmul, "MatMul": _fold_matmul}
    folder = folders.get(producer.op)
    if folder is None or not folder(producer, tensor, scale, outputs, names):
        return None
    placement: dict[str, Placement] = {"LayerNormalization": "layernorm", "Mul": "scale_constant",
                                       "Div": "scale_constant", "Add": "bias_matmul", "MatMul": "matmul"}
    return placement[producer.op], producer.name


def _fold_layernorm(node: gs.Node, tensor: gs.Tensor, scale: np.ndarray, outputs: set[str],
                    names: UniqueNames) -> bool:
    """``LN(x) * gamma/s + beta/s``: legal when LN normalises the last axis (gamma is [K])."""
    if node.outputs[0] is not tensor:
        return False
    axis = int(node.attrs.get("axis", -1))
    rank = len(node.inputs[0].shape) if node.inputs[0].shape is not None else None
    if not (axis == -1 or (rank is not None and axis == rank - 1)):
        return False
    k = scale.shape[0]
    gamma = constant_values(node.inputs[1])
    beta = constant_values(node.inputs[2]) if len(node.inputs) > 2 and node.inputs[2].name else None
    if gamma is None or gamma.shape != (k,) or gamma.dtype != _FLOAT:
        return False
    if len(node.inputs) > 2 and node.inputs[2].name and (beta is None or beta.shape != (k,)):
        return False
    _replace_constant(node.inputs[1], gamma / scale, [(node, 1)], names)
    if beta is not None:
        _replace_constant(node.inputs[2], beta / scale, [(node, 2)], names)
    return True


def _fold_scale_constant(node: gs.Node, tensor: gs.Tensor, scale: np.ndarray, outputs: set[str],
                         names: UniqueNames) -> bool:
    """``a * (c/s)`` or ``a / (c*s)``: legal when ``c`` is a scalar or a per-last-axis vector."""
    constants = [i for i, t in enumerate(node.inputs) if constant_values(t) is not None]
    if node.op == "Div":
        constants = [i for i in constants if i == 1]
    if len(constants) != 1 or len(node.inputs) != 2:
        return False
    index = constants[0]
    values = constant_values(node.inputs[index])
    assert values is not None
    widened = _per_channel(values, scale.shape[0])
    if widened is None:
        return False
    new = widened / scale if node.op == "Mul" else widened * scale
    shape = (1,) * max(values.ndim - 1, 0) + (scale.shape[0],)
    _replace_constant(node.inputs[index], new.reshape(shape).astype(np.float32), [(node, index)], names)
    return True


def _fold_bias_matmul(node: gs.Node, tensor: gs.Tensor, scale: np.ndarray, outputs: set[str],
                      names: UniqueNames) -> bool:
    """``x @ (W/s) + b/s`` for ``Add(MatMul(x, W), b)`` whose MatMul output feeds only the Add."""
    constants = [i for i, t in enumerate(node.inputs) if constant_values(t) is not None]
    if len(constants) != 1 or len(node.inputs) != 2:
        return False
    b_index = constants[0]
    product = node.inputs[1 - b_index]
    matmul = product.inputs[0] if len(product.inputs) == 1 else None
    bias = _per_channel(np.asarray(constant_values(node.inputs[b_index])), scale.shape[0])
    if matmul is None or matmul.op != "MatMul" or bias is None or product.name in outputs \
            or len(product.outputs) != 1 or not _matmul_columns_foldable(matmul, scale.shape[0]):
        return False
    values = constant_values(node.inputs[b_index])
    assert values is not None
    shape = (1,) * max(values.ndim - 1, 0) + (scale.shape[0],)
    _replace_constant(node.inputs[b_index], (bias / scale).reshape(shape).astype(np.float32),
                      [(node, b_index)], names)
    _scale_matmul_columns(matmul, scale, names)
    return True


def _fold_matmul(node: gs.Node, tensor: gs.Tensor, scale: np.ndarray, outputs: set[str],
                 names: UniqueNames) -> bool:
    """``x @ (W/s)`` for a MatMul with a 2-D float32 initializer weight."""
    if not _matmul_columns_foldable(node, scale.shape[0]):
        return False
    _scale_matmul_columns(node, scale, names)
    return True


def _matmul_columns_foldable(node: gs.Node, channels: int) -> bool:
    weight = constant_values(node.inputs[1])
    return (constant_values(node.inputs[0]) is None and weight is not None and weight.dtype == _FLOAT
            and weight.ndim == 2 and weight.shape[1] == channels)


def _scale_matmul_columns(node: gs.Node, scale: np.ndarray, names: UniqueNames) -> None:
    weight = constant_values(node.inputs[1])
    assert weight is not None
    _replace_constant(node.inputs[1], (weight / scale[None, :]).astype(np.float32), [(node, 1)], names)


def _per_channel(values: np.ndarray, channels: int) -> np.ndarray | None:
    """``values`` as a [channels] float32 vector when it broadcasts along the last axis only."""
    if values.dtype != _FLOAT:
        return None
    if values.size == 1:
        return np.full(channels, values.reshape(()), np.float32)
    if values.ndim >= 1 and values.shape[-1] == channels and values.size == channels:
        return values.reshape(channels).astype(np.float32)
    return None


def _replace_constant(tensor: gs.Tensor, values: np.ndarray, users: list[tuple[gs.Node, int]],
                      names: UniqueNames) -> None:
    """Gives ``users`` the new values: in place when nobody else reads the initializer, else a copy.

    A shared initializer (or a Constant node's output) is left as it is for its other readers.
    """
    values = np.ascontiguousarray(values, np.float32)
    user_ids = {id(node) for node, _ in users}
    if isinstance(tensor, gs.Constant) and all(id(c) in user_ids for c in tensor.outputs):
        tensor.values = values
        return
    new = gs.Constant(names(f"{tensor.name}/smoothed"), values)
    for node, index in users:
        node.inputs[index] = new
