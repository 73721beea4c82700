"""Q/DQ placement, insertion and removal (TensorRT explicit quantization), with provenance.

Placement follows TensorRT's explicit-quantization guidance:

* both inputs of every Conv, ConvTranspose, Gemm and MatMul are quantized -- weights (initializers)
  symmetric per output channel, activations symmetric per tensor; never a bias, never an output
  (TensorRT propagates the DQ forward and the Q backward, so output Q/DQ would only block fusions);
* the other input of an ``Add`` fed by a quantized Conv is quantized too, so Conv+Add fuse into one
  INT8 kernel (the ResNet residual);
* a Concat whose output feeds a quantized node gets its inputs quantized with the scale of its
  output, so the Concat moves INT8 data and its Q/DQ pairs cancel.

Every inserted pair is one :class:`QdqRecord`, one pair per (node, input), so removing the pairs
of one node never changes another node.
"""
from __future__ import annotations

import fnmatch
import warnings
from collections.abc import Collection, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from quantdbg.config import Precision, QuantConfig
from quantdbg.errors import ModelError, NotCalibratedError, QuantDbgWarning, unknown
from quantdbg.model import (
    UniqueNames,
    constant_values,
    fits_in_protobuf,
    load_model,
    name_nodes,
    save_model,
    to_graph,
    to_model,
)

if TYPE_CHECKING:  # calibrate.py imports this module (plan_qdq); avoid the cycle at run time
    import os

    from quantdbg.calibrate import CalibrationResult

QMAX = 127
"""Symmetric INT8: values in [-127, 127], so a weight never lands on -128 (TensorRT's range)."""

WEIGHT_CALIBRATOR = "absmax"
EXTERNAL_CALIBRATOR = "external"
"""``QdqRecord.calibrator`` of pairs found in a model quantized elsewhere."""

DEFAULT_QUANT = QuantConfig()
_FLOAT = np.dtype(np.float32)
_WEIGHTED_OPS = frozenset({"Conv", "ConvTranspose", "Gemm", "MatMul"})
# Ops whose output is never negative: a zero-clamping Q/DQ after them needs no Relu once removed.
_NON_NEGATIVE_OPS = frozenset({"Relu", "Sigmoid", "Softmax", "Abs", "Exp", "Sqrt"})
_TINY_AMAX = float(np.finfo(np.float32).tiny) * QMAX


@dataclass(frozen=True)
class QuantTarget:
    """One input of one node that will get a Q/DQ pair.

    Attributes:
        node: Consumer node name (the "layer").
        op_type: The consumer's op type.
        input_index: Which input of the node.
        tensor: ONNX value name of that input in the FP32 model.
        kind: ``"weight"`` (an initializer, per-channel) or ``"activation"`` (per tensor).
        axis: Output-channel axis of a per-channel weight; None for activations and per-tensor
            weights.
    """

    node: str
    op_type: str
    input_index: int
    tensor: str
    kind: Literal["weight", "activation"]
    axis: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """Returns the target as JSON-ready data."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> QuantTarget:
        """Rebuilds a target from :meth:`to_dict` output."""
        return cls(**data)


@dataclass(frozen=True)
class QdqPlan:
    """Where Q/DQ pairs go, decided before calibration so exactly these tensors are calibrated.

    Attributes:
        targets: Every (node, input) to quantize, in graph order.
        shared_scale_groups: Groups of activation tensors that must share one scale (Concat inputs).
    """

    targets: tuple[QuantTarget, ...]
    shared_scale_groups: tuple[tuple[str, ...], ...] = ()

    @property
    def activation_tensors(self) -> tuple[str, ...]:
        """Distinct activation tensors to calibrate, in graph order."""
        return tuple(dict.fromkeys(t.tensor for t in self.targets if t.kind == "activation"))

    @property
    def weight_tensors(self) -> tuple[str, ...]:
        """Distinct weight initializers to quantize, in graph order."""
        return tuple(dict.fromkeys(t.tensor for t in self.targets if t.kind == "weight"))

    @property
    def layers(self) -> tuple[str, ...]:
        """Distinct quantized node names, in graph order."""
        return tuple(dict.fromkeys(t.node for t in self.targets))

    def consumer_ops(self, tensor: str) -> tuple[str, ...]:
        """Op types of the quantized nodes that read ``tensor`` (for ``CalibConfig.method_for``)."""
        return tuple(dict.fromkeys(t.op_type for t in self.targets if t.tensor == tensor))

    def group_of(self, tensor: str) -> tuple[str, ...]:
        """The shared-scale group holding ``tensor``, or ``(tensor,)`` when it has its own scale."""
        for group in self.shared_scale_groups:
            if tensor in group:
                return group
        return (tensor,)

    def to_dict(self) -> dict[str, Any]:
        """Returns the plan as JSON-ready data."""
        return {"targets": [t.to_dict() for t in self.targets],
                "shared_scale_groups": [list(g) for g in self.shared_scale_groups]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> QdqPlan:
        """Rebuilds a plan from :meth:`to_dict` output."""
        return cls(tuple(QuantTarget.from_dict(t) for t in data["targets"]),
                   tuple(tuple(g) for g in data.get("shared_scale_groups", ())))


@dataclass(frozen=True)
class QdqRecord:
    """Provenance of one inserted Q/DQ pair: later stages never parse names to recover it.

    Attributes:
        node: Consumer node name.
        op_type: The consumer's op type.
        input_index: Which input of ``node`` the pair feeds.
        tensor: The FP32 tensor that was quantized.
        kind: ``"weight"`` or ``"activation"``.
        quantize_node: Name of the inserted QuantizeLinear (None when the weight is stored as
            INT8 and only dequantized).
        dequantize_node: Name of the inserted DequantizeLinear.
        scale: The scale(s), one per channel for per-channel weights.
        axis: Channel axis of a per-channel scale, else None.
        calibrator: Calibrator that chose the range (``"absmax"`` for weights).
        zero_point: The zero point(s); all zero for quantdbg's symmetric pairs, possibly not for
            models quantized elsewhere (e.g. ONNX Runtime's uint8 activations).
    """

    node: str
    op_type: str
    input_index: int
    tensor: str
    kind: Literal["weight", "activation"]
    quantize_node: str | None
    dequantize_node: str
    scale: tuple[float, ...]
    axis: int | None
    calibrator: str
    zero_point: tuple[int, ...] = ()

    @property
    def amax(self) -> tuple[float, ...]:
        """The clipping range(s) ``127 * scale`` of a symmetric INT8 pair."""
        return tuple(QMAX * s for s in self.scale)

    def to_dict(self) -> dict[str, Any]:
        """Returns the record as JSON-ready data."""
        data = asdict(self)
        data["scale"] = list(self.scale)
        data["zero_point"] = list(self.zero_point)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> QdqRecord:
        """Rebuilds a record from :meth:`to_dict` output."""
        values = dict(data)
        values["scale"] = tuple(float(s) for s in values["scale"])
        values["zero_point"] = tuple(int(z) for z in values.get("zero_point", ()))
        return cls(**values)


@dataclass(frozen=True)
class QuantizedModel:
    """A Q/DQ model and the record of every pair in it.

    Attributes:
        model: The Q/DQ ONNX model (passes onnx.checker, runs in ONNX Runtime).
        records: One record per inserted pair.
        calibration: The calibration behind the activation scales (None for models quantized
            elsewhere and read with :func:`records_from_model`).
        fallback: Nodes whose Q/DQ pairs were removed, in the order they were removed.
        fallback_precision: Precision those nodes compute in.
    """

    model: onnx.ModelProto
    records: tuple[QdqRecord, ...]
    calibration: CalibrationResult | None = field(default=None, compare=False)
    fallback: tuple[str, ...] = ()
    fallback_precision: Precision | None = None

    @property
    def layers(self) -> tuple[str, ...]:
        """Distinct quantized node names, in graph order."""
        return tuple(dict.fromkeys(r.node for r in self.records))

    def records_of(self, node: str) -> tuple[QdqRecord, ...]:
        """The records of the pairs feeding ``node`` (empty when it is not quantized)."""
        return tuple(r for r in self.records if r.node == node)

    def save(self, path: str | os.PathLike) -> Path:
        """Writes the Q/DQ model atomically (see :func:`quantdbg.model.save_model`).

        Args:
            path: Destination ``.onnx`` path; its folder must exist.

        Returns:
            The destination path.

        Raises:
            ModelError: The destination folder does not exist.
        """
        return save_model(self.model, path)

    def to_dict(self) -> dict[str, Any]:
        """Returns the provenance (records and fallback, not the model bytes) as JSON-ready data."""
        precision = None if self.fallback_precision is None else self.fallback_precision.value
        return {"records": [r.to_dict() for r in self.records], "fallback": list(self.fallback),
                "fallback_precision": precision}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], model: onnx.ModelProto) -> QuantizedModel:
        """Rebuilds a QuantizedModel from :meth:`to_dict` output and the model it describes."""
        precision = data.get("fallback_precision")
        return cls(model, tuple(QdqRecord.from_dict(r) for r in data["records"]),
                   fallback=tuple(data.get("fallback", ())),
                   fallback_precision=None if precision is None else Precision(precision))


# --------------------------------------------------------------------------------------------
# Placement
# --------------------------------------------------------------------------------------------

def plan_qdq(model: onnx.ModelProto, config: QuantConfig = DEFAULT_QUANT) -> QdqPlan:
    """Decides which (node, input) pairs get Q/DQ, before any calibration.

    Unnamed nodes are named as :func:`quantdbg.model.name_nodes` names them, so the plan matches
    the model :func:`insert_qdq` builds. The model is not modified.

    Args:
        model: The FP32 model (ideally from :func:`quantdbg.model.load_model`, so tensor dtypes
            are known; unknown dtypes count as float).
        config: Op types to quantize, exclusions, and the residual/Concat rules.

    Returns:
        The plan: targets in graph order and the Concat shared-scale groups.

    Raises:
        ModelError: An exclusion name or glob matches no node (the message suggests close names).
    """
    graph = to_graph(model)
    _name_graph_nodes(graph)
    _check_excludes(graph, config)
    order = {node.name: i for i, node in enumerate(graph.nodes)}
    targets: dict[tuple[str, int], QuantTarget] = {}
    quantized_convs: set[str] = set()
    for node in graph.nodes:
        if node.op in config.op_types and not config.is_excluded(node.name):
            found = _node_targets(node, config)
            for target in found:
                targets[(target.node, target.input_index)] = target
            if node.op == "Conv" and found:
                quantized_convs.add(node.name)
    if config.quantize_residual_add:
        for node in graph.nodes:
            residual = _residual_target(node, quantized_convs, config)
            if residual is not None:
                targets.setdefault((residual.node, residual.input_index), residual)
    groups: list[list[str]] = []
    if config.share_concat_scales:
        groups = _concat_targets(graph, targets, config)
    ordered = sorted(targets.values(), key=lambda t: (order[t.node], t.input_index))
    return QdqPlan(tuple(ordered), _ordered_groups(groups, ordered))


def _name_graph_nodes(graph: gs.Graph) -> None:
    # Same rule as quantdbg.model.name_nodes, applied to the graph's own copy.
    seen: set[str] = set()
    for i, node in enumerate(graph.nodes):
        if not node.name or node.name in seen:
            node.name = f"{node.op}_{i}"
        seen.add(node.name)


def _check_excludes(graph: gs.Graph, config: QuantConfig) -> None:
    names = [node.name for node in graph.nodes]
    for pattern in config.exclude:
        if not any(fnmatch.fnmatchcase(name, pattern) for name in names):
            err = unknown("node", pattern, names)
            raise ModelError(f"QuantConfig.exclude entry {pattern!r} matches no node. {err}")


def _is_float(tensor: gs.Tensor) -> bool:
    dtype = tensor.dtype
    if dtype is None:
        return True
    return not _is_onnx_enum(dtype) and np.dtype(dtype) == _FLOAT


def _is_onnx_enum(dtype: Any) -> bool:
    # gs keeps dtypes NumPy lacks (bfloat16, float8) as onnx.TensorProto enums (ints).
    return isinstance(dtype, int) and not isinstance(dtype, np.dtype)


def _quantizable_inputs(node: gs.Node) -> list[int]:
    """Input indices a quantized node of this op type gets Q/DQ on."""
    present = [i for i, t in enumerate(node.inputs) if t.name and _is_float(t)]
    if node.op in _WEIGHTED_OPS:
        return [i for i in present if i < 2]  # data and weight; input 2 of Conv/Gemm is the bias
    # Other op types asked for in QuantConfig.op_types: every float activation input.
    return [i for i in present if not isinstance(node.inputs[i], gs.Constant)]


def _weight_axis(node: gs.Node, index: int, weight: gs.Constant, config: QuantConfig) -> int | None:
    """Output-channel axis of a weight input, or None when it is quantized per tensor."""
    if not config.per_channel:
        return None
    rank = len(weight.shape)
    if node.op == "Conv" and index == 1 and rank >= 2:
        return 0  # [C_out, C_in/group, k...]
    if node.op == "ConvTranspose" and index == 1 and rank >= 2:
        return 1  # [C_in, C_out/group, k...]
    if node.op == "Gemm" and index == 1 and rank == 2:
        return 0 if node.attrs.get("transB", 0) else 1  # B is [N, K] when transposed, else [K, N]
    if node.op == "MatMul" and index == 1 and rank >= 2:
        return rank - 1  # [..., K, N]: one scale per output column
    return None  # a constant on the left of a MatMul/Gemm, or an unknown op: per tensor


def _node_targets(node: gs.Node, config: QuantConfig) -> list[QuantTarget]:
    targets = []
    for index in _quantizable_inputs(node):
        tensor = node.inputs[index]
        if isinstance(tensor, gs.Constant):
            axis = _weight_axis(node, index, tensor, config)
            targets.append(QuantTarget(node.name, node.op, index, tensor.name, "weight", axis))
        else:
            targets.append(QuantTarget(node.name, node.op, index, tensor.name, "activation"))
    return targets


def _residual_target(node: gs.Node, quantized_convs: set[str], config: QuantConfig) -> QuantTarget | None:
    """The input of an Add to quantize so TensorRT can fuse the Add into its Conv producer."""
    if node.op != "Add" or len(node.inputs) != 2 or config.is_excluded(node.name):
        return None
    from_conv = [i for i, t in enumerate(node.inputs)
                 if len(t.inputs) == 1 and t.inputs[0].op == "Conv" and t.inputs[0].name in quantized_convs]
    if not from_conv or node.inputs[0] is node.inputs[1]:
        return None
    # The first Conv-fed input fuses; the other input (identity or projection) is read as INT8.
    other = 1 - from_conv[0]
    tensor = node.inputs[other]
    if isinstance(tensor, gs.Constant) or not _is_float(tensor):
        return None
    return QuantTarget(node.name, node.op, other, tensor.name, "activation")


def _concat_targets(graph: gs.Graph, targets: dict[tuple[str, int], QuantTarget],
                    config: QuantConfig) -> list[list[str]]:
    """Adds Q/DQ on the inputs of every Concat whose output is quantized; returns scale groups.

    Repeats until nothing changes, so a Concat feeding a quantized Concat is handled too.
    """
    parent: dict[str, str] = {}

    def find(name: str) -> str:
        while parent.setdefault(name, name) != name:
            name = parent[name]
        return name

    done: set[str] = set()
    changed = True
    while changed:
        changed = False
        quantized = {t.tensor for t in targets.values() if t.kind == "activation"}
        for node in graph.nodes:
            if (node.op != "Concat" or node.name in done or config.is_excluded(node.name)
                    or node.outputs[0].name not in quantized):
                continue
            done.add(node.name)
            changed = True
            for index, tensor in enumerate(node.inputs):
                if isinstance(tensor, gs.Constant) or not _is_float(tensor):
                    continue
                targets.setdefault((node.name, index),
                                   QuantTarget(node.name, node.op, index, tensor.name, "activation"))
                parent[find(tensor.name)] = find(node.outputs[0].name)
    groups: dict[str, list[str]] = {}
    for name in parent:
        groups.setdefault(find(name), []).append(name)
    return [members for members in groups.values() if len(members) > 1]


def _ordered_groups(groups: list[list[str]], targets: list[QuantTarget]) -> tuple[tuple[str, ...], ...]:
    rank = {name: i for i, name in enumerate(dict.fromkeys(t.tensor for t in targets))}
    ordered = [tuple(sorted(g, key=lambda name: rank.get(name, len(rank)))) for g in groups]
    return tuple(sorted(ordered, key=lambda g: rank.get(g[0], len(rank))))


# --------------------------------------------------------------------------------------------
# Insertion
# --------------------------------------------------------------------------------------------

def insert_qdq(model: onnx.ModelProto | str | os.PathLike, calibration: CalibrationResult,
               config: QuantConfig = DEFAULT_QUANT, *, keep_fp: Collection[str] = frozenset(),
               plan: QdqPlan | None = None) -> QuantizedModel:
    """Inserts one QuantizeLinear/DequantizeLinear pair per planned (node, input).

    Activations are symmetric per tensor (scale ``amax / 127``, zero point int8 0; a shared-scale
    group uses the largest amax of its members). Weights stay FP32 initializers followed by
    QuantizeLinear -> DequantizeLinear with per-channel scales ``channel amax / 127``, so the
    INT8 values lie in [-127, 127]; TensorRT and ONNX Runtime fold the pair into INT8 weights.

    Args:
        model: The FP32 model or its path (never modified).
        calibration: Activation ranges from :func:`quantdbg.calibrate.calibrate`.
        config: Placement settings (used to plan when ``plan`` is None).
        keep_fp: Node names to leave without Q/DQ.
        plan: A plan from :func:`plan_qdq` (e.g. the one calibration used).

    Returns:
        The Q/DQ model (named nodes, passes onnx.checker) with one record per pair and
        ``calibration`` attached.

    Raises:
        ModelError: The model is invalid or already quantized, a ``keep_fp`` name is not a
            quantizable node, the plan does not match the model, or a weight is not finite.
        NotCalibratedError: An activation to quantize has no range in ``calibration``.
    """
    return insert_qdq_loaded(name_nodes(load_model(model)), calibration, config, keep_fp=keep_fp, plan=plan)


def insert_qdq_loaded(fp_model: onnx.ModelProto, calibration: CalibrationResult,
                      config: QuantConfig = DEFAULT_QUANT, *, keep_fp: Collection[str] = frozenset(),
                      plan: QdqPlan | None = None) -> QuantizedModel:
    """:func:`insert_qdq` on a model already through ``name_nodes(load_model(...))``.

    Skips the second load (checker and shape inference take seconds on large models).

    Args:
        fp_model: The loaded FP32 model with named nodes (not modified).
        calibration: Activation ranges.
        config: Placement settings (used to plan when ``plan`` is None).
        keep_fp: Node names to leave without Q/DQ.
        plan: A plan from :func:`plan_qdq` on ``fp_model``.

    Returns:
        As :func:`insert_qdq`.

    Raises:
        ModelError: As :func:`insert_qdq`.
        NotCalibratedError: An activation to quantize has no range in ``calibration``.
    """
    plan = plan if plan is not None else plan_qdq(fp_model, config)
    _check_names("quantizable node", keep_fp, plan.layers)
    scales = _activation_scales(plan, calibration, keep_fp)
    graph = to_graph(fp_model)
    nodes = {node.name: node for node in graph.nodes}
    names = UniqueNames.of_graph(graph)
    records = []
    for target in plan.targets:
        if target.node in keep_fp:
            continue
        node = _planned_node(nodes, target)
        if target.kind == "weight":
            scale, zero_point, method = _weight_qparams(node.inputs[target.input_index], target)
        else:
            scale, method = scales[target.tensor]
            zero_point = np.zeros((), np.int8)
        records.append(_insert_pair(graph, node, target, scale, zero_point, method, names))
    qmodel = to_model(graph, like=fp_model)
    _checked(qmodel)
    return QuantizedModel(qmodel, tuple(records), calibration)


def _check_names(kind: str, names: Iterable[str], known: Collection[str]) -> None:
    known_set = set(known)
    for name in names:
        if name not in known_set:
            raise unknown(kind, name, known)


def _activation_scales(plan: QdqPlan, calibration: CalibrationResult,
                       keep_fp: Collection[str]) -> dict[str, tuple[np.ndarray, str]]:
    """Tensor -> (float32 scale, calibrator) for every activation that gets a pair."""
    needed = {t.tensor: t.node for t in plan.targets if t.kind == "activation" and t.node not in keep_fp}
    scales: dict[str, tuple[np.ndarray, str]] = {}
    for tensor, node in needed.items():
        best_amax, best_method = -1.0, ""
        for member in plan.group_of(tensor):
            rng = calibration.ranges.get(member)
            if rng is None:
                raise NotCalibratedError(
                    f"Activation tensor {member!r} (input of node {node!r}"
                    f"{'' if member == tensor else f', sharing one scale with {tensor!r}'}) has no "
                    "calibrated range. Calibrate with the same QdqPlan/QuantConfig used here "
                    "(quantdbg.calibrate(..., plan=plan)), or leave the node out with keep_fp.")
            if rng.amax > best_amax:
                best_amax, best_method = rng.amax, rng.method
        scales[tensor] = (_scale_from_amax(np.float64(best_amax)), best_method)
    return scales


def _scale_from_amax(amax: np.ndarray) -> np.ndarray:
    """float32 ``amax / 127``; an all-zero (or subnormal) range gets scale 1/127 instead of 0.

    Any non-zero scale reproduces zeros exactly, and ONNX requires a positive scale.
    """
    amax = np.asarray(amax, np.float64)
    safe = np.where(np.isfinite(amax) & (amax >= _TINY_AMAX), amax, 1.0)
    return (safe / QMAX).astype(np.float32)


def _planned_node(nodes: Mapping[str, gs.Node], target: QuantTarget) -> gs.Node:
    node = nodes.get(target.node)
    if node is None or len(node.inputs) <= target.input_index \
            or node.inputs[target.input_index].name != target.tensor:
        raise ModelError(
            f"The QdqPlan does not match the model: expected node {target.node!r} to read tensor "
            f"{target.tensor!r} at input {target.input_index}. Build the plan with plan_qdq() on "
            "this same model.")
    return node


def _weight_qparams(weight: gs.Tensor, target: QuantTarget) -> tuple[np.ndarray, np.ndarray, str]:
    if not isinstance(weight, gs.Constant):
        raise ModelError(f"Weight input {target.input_index} ({target.tensor!r}) of node {target.node!r} "
                         "is not an initializer; re-plan with plan_qdq() on this model.")
    values = np.asarray(weight.values, np.float32)
    if not np.all(np.isfinite(values)):
        raise ModelError(f"Weight {target.tensor!r} of node {target.node!r} holds NaN or Inf values; "
                         "fix the model's weights before quantizing.")
    absval = np.abs(values)
    if target.axis is None:
        amax = np.asarray(absval.max() if absval.size else 0.0)
    else:
        amax = absval.max(axis=tuple(a for a in range(values.ndim) if a != target.axis))
    scale = _scale_from_amax(amax)
    return scale, np.zeros(scale.shape, np.int8), WEIGHT_CALIBRATOR


def _insert_pair(graph: gs.Graph, node: gs.Node, target: QuantTarget, scale: np.ndarray,
                 zero_point: np.ndarray, method: str, names: UniqueNames) -> QdqRecord:
    source = node.inputs[target.input_index]
    base = f"{node.name}/input{target.input_index}"
    attrs = {} if target.axis is None else {"axis": target.axis}
    scale_c = gs.Constant(names(f"{base}/scale"), np.asarray(scale, np.float32))
    zp_c = gs.Constant(names(f"{base}/zero_point"), np.asarray(zero_point, np.int8))
    quantized = gs.Variable(names(f"{base}/quantized"), np.int8, source.shape)
    dequantized = gs.Variable(names(f"{base}/dequantized"), np.float32, source.shape)
    q = gs.Node("QuantizeLinear", names(f"{base}/QuantizeLinear"), dict(attrs),
                inputs=[source, scale_c, zp_c], outputs=[quantized])
    dq = gs.Node("DequantizeLinear", names(f"{base}/DequantizeLinear"), dict(attrs),
                 inputs=[quantized, scale_c, zp_c], outputs=[dequantized])
    graph.nodes.extend([q, dq])
    node.inputs[target.input_index] = dequantized
    return QdqRecord(node.name, node.op, target.input_index, target.tensor, target.kind, q.name, dq.name,
                     tuple(float(s) for s in np.atleast_1d(scale)), target.axis, method,
                     tuple(int(z) for z in np.atleast_1d(zero_point)))


def _checked(model: onnx.ModelProto) -> None:
    try:
        if fits_in_protobuf(model):
            onnx.checker.check_model(model)
    except onnx.checker.ValidationError as err:  # a bug in quantdbg, not a user error
        raise AssertionError(f"quantdbg produced an invalid ONNX model: {err}") from err


# --------------------------------------------------------------------------------------------
# Removal (fallback) and models quantized elsewhere
# --------------------------------------------------------------------------------------------

def remove_qdq(qmodel: QuantizedModel, nodes: Iterable[str],
               precision: Precision = Precision.FP16) -> QuantizedModel:
    """Takes nodes out of INT8: their Q/DQ pairs go, and they compute in FP16 or FP32.

    Each input of a fallback node is wired back to its FP32 tensor (a weight stored as INT8 is
    replaced by its dequantized FP32 constant). With FP16, float inputs are cast to float16
    (initializers converted once, ahead of time) and float outputs cast back to float32 under
    their original names, so the rest of the graph is untouched. Other nodes keep their pairs.

    On ONNX Runtime's CPU provider FP16 graphs run, but on x86 it has no float16 Conv, MatMul,
    Gemm or Add kernels: it inserts casts and computes those nodes in float32 from the
    float16-rounded inputs and weights (rounding the output to float16 again). That models
    FP16 storage, not FP16 accumulation; choose FP32 when a CPU reference run should be exact.

    A removed activation pair whose zero point is the lowest code (as ONNX Runtime writes after
    deleting a Relu it considers redundant) also clamped negatives to zero; a Relu takes over
    that clamp so the node still sees what it saw before.

    Args:
        qmodel: A Q/DQ model from :func:`insert_qdq` or :func:`records_from_model`.
        nodes: Quantized node names to fall back.
        precision: FP16 (what TensorRT would run) or FP32 (exact, for CPU reference runs).

    Returns:
        A new QuantizedModel without those nodes' records; ``fallback`` lists every node
        fallen back so far.

    Raises:
        ModelError: A name is not a quantized node of ``qmodel`` (close names are suggested), or
            the model no longer matches its records.
    """
    precision = Precision(precision)
    chosen = list(dict.fromkeys(nodes))
    _check_names("quantized node", chosen, qmodel.layers)
    graph = to_graph(qmodel.model)
    by_name = {node.name: node for node in graph.nodes}
    names = UniqueNames.of_graph(graph)
    for name in chosen:
        node = by_name.get(name)
        if node is None:
            raise ModelError(f"Node {name!r} has Q/DQ records but is not in the model; the records "
                             "and the model disagree. Rebuild them with records_from_model().")
        for record in qmodel.records_of(name):
            node.inputs[record.input_index] = _fp32_source(graph, node, record, names)
        if precision is Precision.FP16:
            _to_fp16(graph, node, names)
    # No onnx.checker pass here: sweeps call this once per variant, and on a 90 MB model the
    # checker's serialisation would cost twice the edit itself (the tests check the results).
    model = to_model(graph, like=qmodel.model)
    kept = tuple(r for r in qmodel.records if r.node not in set(chosen))
    return QuantizedModel(model, kept, qmodel.calibration, qmodel.fallback + tuple(chosen), precision)


def _fp32_source(graph: gs.Graph, node: gs.Node, record: QdqRecord, names: UniqueNames) -> gs.Tensor:
    """The FP32 tensor behind the DequantizeLinear feeding ``node`` at ``record.input_index``."""
    fed = node.inputs[record.input_index]
    dq = fed.inputs[0] if len(fed.inputs) == 1 else None
    if dq is None or dq.op != "DequantizeLinear" or dq.name != record.dequantize_node:
        raise ModelError(f"Input {record.input_index} of node {record.node!r} is not produced by "
                         f"DequantizeLinear {record.dequantize_node!r} as its record says; the model "
                         "was edited after quantization. Rebuild the records with records_from_model().")
    source = dq.inputs[0]
    producer = source.inputs[0] if len(source.inputs) == 1 else None
    if producer is not None and producer.op == "QuantizeLinear":
        fp = producer.inputs[0]
        if _clamps_at_zero(dq) and not (len(fp.inputs) == 1 and fp.inputs[0].op in _NON_NEGATIVE_OPS):
            fp = _relu(graph, fp, f"{node.name}/input{record.input_index}", names)
        return fp
    values = constant_values(source)
    if values is None:
        raise ModelError(f"DequantizeLinear {dq.name!r} feeding node {record.node!r} reads "
                         f"{source.name!r}, which is neither a QuantizeLinear output nor a constant; "
                         "cannot recover its FP32 values.")
    return gs.Constant(names(f"{source.name}/dequantized"), _dequantize(dq, values))


def _clamps_at_zero(dq: gs.Node) -> bool:
    """True when the pair's zero point is the lowest code, so it maps every negative value to 0.

    ONNX Runtime's quantizer deletes a Relu whose output gets such a pair (the clamp does the
    Relu's work), so removing the pair must put the clamp back.
    """
    zp = constant_values(dq.inputs[2]) if len(dq.inputs) > 2 and dq.inputs[2].name else None
    if zp is None or zp.dtype not in (np.int8, np.uint8):
        return False
    return bool(np.all(zp == np.iinfo(zp.dtype).min))


def _relu(graph: gs.Graph, tensor: gs.Tensor, base: str, names: UniqueNames) -> gs.Variable:
    out = gs.Variable(names(f"{base}/clamped"), tensor.dtype, tensor.shape)
    graph.nodes.append(gs.Node("Relu", names(f"{base}/Relu"), inputs=[tensor], outputs=[out]))
    return out


def _dequantize(dq: gs.Node, values: np.ndarray) -> np.ndarray:
    """NumPy DequantizeLinear: ``(x - zero_point) * scale`` in float32, per axis when 1-D scale."""
    scale = constant_values(dq.inputs[1])
    if scale is None:
        raise ModelError(f"DequantizeLinear {dq.name!r} has a computed scale; cannot dequantize its weight.")
    zp = constant_values(dq.inputs[2]) if len(dq.inputs) > 2 and dq.inputs[2].name else None
    zp = np.zeros_like(scale, np.int32) if zp is None else zp.astype(np.int32)
    scale = scale.astype(np.float32)
    if scale.ndim == 1 and scale.size > 1:
        axis = int(dq.attrs.get("axis", 1)) % values.ndim
        shape = [1] * values.ndim
        shape[axis] = scale.size
        scale, zp = scale.reshape(shape), zp.reshape(shape)
    return ((values.astype(np.int32) - zp).astype(np.float32) * scale).astype(np.float32)


def _to_fp16(graph: gs.Graph, node: gs.Node, names: UniqueNames) -> None:
    """Makes ``node`` compute in float16 between casts; weights become float16 initializers."""
    for index, tensor in enumerate(node.inputs):
        if not tensor.name or not _is_float(tensor):
            continue
        if isinstance(tensor, gs.Constant):
            node.inputs[index] = gs.Constant(names(f"{tensor.name}/fp16"), _half(tensor, node.name))
            continue
        cast_out = gs.Variable(names(f"{node.name}/input{index}/fp16"), np.float16, tensor.shape)
        graph.nodes.append(gs.Node("Cast", names(f"{node.name}/input{index}/Cast_fp16"),
                                   {"to": onnx.TensorProto.FLOAT16}, inputs=[tensor], outputs=[cast_out]))
        node.inputs[index] = cast_out
    for index, tensor in enumerate(list(node.outputs)):
        if not _is_float(tensor):
            continue
        half = gs.Variable(names(f"{tensor.name}/fp16"), np.float16, tensor.shape)
        node.outputs[index] = half
        graph.nodes.append(gs.Node("Cast", names(f"{node.name}/output{index}/Cast_fp32"),
                                   {"to": onnx.TensorProto.FLOAT}, inputs=[half], outputs=[tensor]))


def _half(constant: gs.Constant, node: str) -> np.ndarray:
    """float16 copy of an initializer, saturated (not turned into inf) beyond float16's range."""
    values = np.asarray(constant.values, np.float32)
    limit = float(np.finfo(np.float16).max)
    if np.any(np.abs(values[np.isfinite(values)]) > limit):
        warnings.warn(f"Initializer {constant.name!r} of node {node!r} holds values beyond float16's "
                      f"range (+-{limit:g}); they are clipped in the FP16 fallback. Keep this node in "
                      "FP32 (precision=Precision.FP32) if that matters.", QuantDbgWarning, stacklevel=4)
    return np.clip(values, -limit, limit).astype(np.float16)


def records_from_model(model: onnx.ModelProto | str | os.PathLike) -> QuantizedModel:
    """Reads the Q/DQ pairs of a model quantized elsewhere (ModelOpt, ONNX Runtime QDQ format).

    Walks the graph, not the names: every input of a compute node produced by a DequantizeLinear
    becomes a record -- ``QuantizeLinear -> DequantizeLinear -> node`` (weight when the Q reads an
    initializer, else activation) or ``INT8 initializer -> DequantizeLinear -> node`` (weight, no
    Q). :func:`remove_qdq` then works on these records like on quantdbg's own.

    Args:
        model: The Q/DQ model or its path (never modified).

    Returns:
        The model (nodes named) with one record per (node, dequantized input), calibrator
        ``"external"``.

    Raises:
        ModelError: The model does not load or a DequantizeLinear's scale is not a constant.
    """
    loaded = name_nodes(load_model(model, allow_quantized=True))
    graph = to_graph(loaded)
    records = []
    for node in graph.nodes:
        if node.op in ("QuantizeLinear", "DequantizeLinear"):
            continue
        for index, tensor in enumerate(node.inputs):
            dq = tensor.inputs[0] if tensor.name and len(tensor.inputs) == 1 else None
            if dq is not None and dq.op == "DequantizeLinear":
                records.append(_external_record(node, index, dq))
    if not records:
        warnings.warn("The model holds no DequantizeLinear feeding a compute node: nothing is "
                      "quantized in Q/DQ form, so there is nothing to analyse or fall back.",
                      QuantDbgWarning, stacklevel=2)
    return QuantizedModel(loaded, tuple(records))


def _external_record(node: gs.Node, index: int, dq: gs.Node) -> QdqRecord:
    source = dq.inputs[0]
    producer = source.inputs[0] if len(source.inputs) == 1 else None
    scale = constant_values(dq.inputs[1])
    if scale is None:
        raise ModelError(f"DequantizeLinear {dq.name!r} (feeding node {node.name!r}) has a computed scale; "
                         "only constant scales are supported.")
    zp = constant_values(dq.inputs[2]) if len(dq.inputs) > 2 and dq.inputs[2].name else None
    zp = np.zeros(scale.shape, np.int64) if zp is None else zp
    axis = int(dq.attrs.get("axis", 1)) if scale.size > 1 else None
    if producer is not None and producer.op == "QuantizeLinear":
        fp = producer.inputs[0]
        kind: Literal["weight", "activation"] = "weight" if constant_values(fp) is not None else "activation"
        quantize_node, tensor = producer.name, fp.name
    else:
        kind, quantize_node, tensor = "weight", None, source.name
    return QdqRecord(node.name, node.op, index, tensor, kind, quantize_node, dq.name,
                     tuple(float(s) for s in np.ravel(scale)), axis, EXTERNAL_CALIBRATOR,
                     tuple(int(z) for z in np.ravel(zp)))

