"""Q/DQ placement: which (node, input) pairs get a Q/DQ pair, decided before any calibration.

Placement follows TensorRT's explicit-quantization guidance:

* both inputs of every Conv, ConvTranspose, Gemm and MatMul are quantized -- weights symmetric per
  output channel with their own max|w|, activations symmetric per tensor; never a bias, never an
  output (TensorRT propagates the DQ forward and the Q backward, so output Q/DQ would only block
  fusions). A weight is any input constants alone compute: held in a Constant node, behind a
  Transpose or a Cast of an initializer, or an initializer also listed as a graph input, it is
  folded into an initializer first (:func:`quantdbg.model.weights.fold_weights`; recorded in
  :attr:`QdqPlan.folded_weights`), so it is never calibrated as an activation;
* the other input of an ``Add`` fed by a quantized Conv is quantized too, so Conv+Add fuse into one
  INT8 kernel (the ResNet residual);
* a Concat whose output feeds a quantized node gets its inputs quantized with the scale of its
  output, so the Concat moves INT8 data and its Q/DQ pairs cancel.

The plan is made before calibration, so exactly the planned activations are calibrated, and no
tensor constants alone compute is ever one of them.
"""
from __future__ import annotations

from dataclasses import dataclass

import onnx
import onnx_graphsurgeon as gs

from quantdbg import _json
from quantdbg.config import QuantConfig, TensorKind
from quantdbg.model import LoadedModel
from quantdbg.model.graph import is_float, to_graph, trans_b
from quantdbg.model.names import check_node_globs, name_graph_nodes
from quantdbg.model.weights import WEIGHTED_OPS, FoldedWeight, constant_tensors, fold_weights
from quantdbg.quant_math import weight_axis

DEFAULT_QUANT = QuantConfig()


@dataclass(frozen=True)
class QuantTarget(_json.Serializable):
    """One input of one node that will get a Q/DQ pair.

    Attributes:
        node: Consumer node name (the "layer").
        op_type: The consumer's op type.
        input_index: Which input of the node.
        tensor: ONNX value name of that input in the FP32 model.
        kind: :attr:`TensorKind.WEIGHT` (constants compute it: per output channel) or
            :attr:`TensorKind.ACTIVATION` (per tensor).
        axis: Output-channel axis of a per-channel weight; None for activations and per-tensor
            weights.
    """

    node: str
    op_type: str
    input_index: int
    tensor: str
    kind: TensorKind
    axis: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", TensorKind(self.kind))  # also from plain strings


@dataclass(frozen=True)
class QdqPlan(_json.Serializable):
    """Where Q/DQ pairs go, decided before calibration so exactly these tensors are calibrated.

    Attributes:
        targets: Every (node, input) to quantize, in graph order.
        shared_scale_groups: Groups of activation tensors that must share one scale (Concat inputs).
        folded_weights: Weights the model held outside plain initializers (Constant nodes,
            Transpose/Cast/... of initializers, initializers listed as graph inputs) and how they
            were handled, in graph order; they are planned as weights like any initializer.
    """

    targets: tuple[QuantTarget, ...]
    shared_scale_groups: tuple[tuple[str, ...], ...] = ()
    folded_weights: tuple[FoldedWeight, ...] = ()

    @property
    def activation_tensors(self) -> tuple[str, ...]:
        """Distinct activation tensors to calibrate, in graph order."""
        return tuple(dict.fromkeys(t.tensor for t in self.targets if t.kind is TensorKind.ACTIVATION))

    @property
    def weight_tensors(self) -> tuple[str, ...]:
        """Distinct weight initializers to quantize, in graph order."""
        return tuple(dict.fromkeys(t.tensor for t in self.targets if t.kind is TensorKind.WEIGHT))

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


def plan_qdq(model: onnx.ModelProto | LoadedModel, config: QuantConfig = DEFAULT_QUANT) -> QdqPlan:
    """Decides which (node, input) pairs get Q/DQ, before any calibration.

    Unnamed nodes are named as :func:`quantdbg.model.names.name_nodes` names them, and weights that are
    not plain initializers are folded as :func:`quantdbg.model.load_model` folds them, so the plan
    matches the model :func:`insert_qdq` builds. The model is not modified.

    Args:
        model: The FP32 model: a :class:`~quantdbg.model.LoadedModel` (its folded weights are
            listed in the plan) or a ModelProto (ideally from :func:`quantdbg.model.load_model`,
            so tensor dtypes are known; unknown dtypes count as float).
        config: Op types to quantize, exclusions, and the residual/Concat rules.

    Returns:
        The plan: targets in graph order, the Concat shared-scale groups and the folded weights.

    Raises:
        ModelError: An exclusion name or glob matches no node (the message suggests close names),
            or a weight computed from constants cannot be evaluated.
    """
    proto, folded = (model.proto, model.folded) if isinstance(model, LoadedModel) else fold_weights(model)
    graph = name_graph_nodes(to_graph(proto))
    check_node_globs("QuantConfig.exclude", config.exclude, [node.name for node in graph.nodes])
    constants = constant_tensors(proto)
    order = {node.name: i for i, node in enumerate(graph.nodes)}
    targets: dict[tuple[str, int], QuantTarget] = {}
    quantized_convs: set[str] = set()
    for node in graph.nodes:
        if node.op in config.op_types and not config.is_excluded(node.name):
            found = _node_targets(node, config, constants)
            for target in found:
                targets[(target.node, target.input_index)] = target
            if node.op == "Conv" and found:
                quantized_convs.add(node.name)
    if config.quantize_residual_add:
        for node in graph.nodes:
            residual = _residual_target(node, quantized_convs, config, constants)
            if residual is not None:
                targets.setdefault((residual.node, residual.input_index), residual)
    groups: list[list[str]] = []
    if config.share_concat_scales:
        groups = _concat_targets(graph, targets, config, constants)
    ordered = sorted(targets.values(), key=lambda t: (order[t.node], t.input_index))
    return QdqPlan(tuple(ordered), _ordered_groups(groups, ordered), folded)


def _is_activation(tensor: gs.Tensor, constants: frozenset[str]) -> bool:
    """A float tensor that depends on the graph inputs (not computed from constants alone)."""
    return not isinstance(tensor, gs.Constant) and tensor.name not in constants and is_float(tensor)


def _quantizable_inputs(node: gs.Node, constants: frozenset[str]) -> list[int]:
    """Input indices a quantized node of this op type gets Q/DQ on."""
    present = [i for i, t in enumerate(node.inputs) if t.name and is_float(t)]
    if node.op in WEIGHTED_OPS:
        return [i for i in present if i < 2]  # data and weight; input 2 of Conv/Gemm is the bias
    # Other op types asked for in QuantConfig.op_types: every float activation input.
    return [i for i in present if _is_activation(node.inputs[i], constants)]


def _weight_axis(node: gs.Node, index: int, weight: gs.Constant, config: QuantConfig) -> int | None:
    """Output-channel axis of a weight input, or None when it is quantized per tensor."""
    if not config.per_channel or index != 1:
        return None  # a constant on the left of a MatMul/Gemm is quantized per tensor
    return weight_axis(node.op, len(weight.shape), trans_b(node))


def _node_targets(node: gs.Node, config: QuantConfig, constants: frozenset[str]) -> list[QuantTarget]:
    targets = []
    for index in _quantizable_inputs(node, constants):
        tensor = node.inputs[index]
        if isinstance(tensor, gs.Constant):
            axis = _weight_axis(node, index, tensor, config)
            targets.append(QuantTarget(node.name, node.op, index, tensor.name, TensorKind.WEIGHT, axis))
        else:
            targets.append(QuantTarget(node.name, node.op, index, tensor.name, TensorKind.ACTIVATION))
    return targets


def _residual_target(node: gs.Node, quantized_convs: set[str], config: QuantConfig,
                     constants: frozenset[str]) -> QuantTarget | None:
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
    if not _is_activation(tensor, constants):
        return None
    return QuantTarget(node.name, node.op, other, tensor.name, TensorKind.ACTIVATION)


def _concat_targets(graph: gs.Graph, targets: dict[tuple[str, int], QuantTarget],
                    config: QuantConfig, constants: frozenset[str]) -> list[list[str]]:
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
        quantized = {t.tensor for t in targets.values() if t.kind is TensorKind.ACTIVATION}
        for node in graph.nodes:
            if (node.op != "Concat" or node.name in done or config.is_excluded(node.name)
                    or node.outputs[0].name not in quantized):
                continue
            done.add(node.name)
            changed = True
            for index, tensor in enumerate(node.inputs):
                if not _is_activation(tensor, constants):
                    continue
                targets.setdefault((node.name, index),
                                   QuantTarget(node.name, node.op, index, tensor.name, TensorKind.ACTIVATION))
                parent[find(tensor.name)] = find(node.outputs[0].name)
    groups: dict[str, list[str]] = {}
    for name in parent:
        groups.setdefault(find(name), []).append(name)
    return [members for members in groups.values() if len(members) > 1]


def _ordered_groups(groups: list[list[str]], targets: list[QuantTarget]) -> tuple[tuple[str, ...], ...]:
    rank = {name: i for i, name in enumerate(dict.fromkeys(t.tensor for t in targets))}
    ordered = [tuple(sorted(g, key=lambda name: rank.get(name, len(rank)))) for g in groups]
    return tuple(sorted(ordered, key=lambda g: rank.get(g[0], len(rank))))


