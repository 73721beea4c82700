"""Empirical bias correction (Nagel et al., "Data-Free Quantization Through Weight Equalization and Bias
Correction", ICCV 2019): the systematic part of the weight-rounding error, removed from the bias.

A layer ``y = W x + b`` with INT8 weights computes ``W_q x + b = y + (W_q - W) x``: rounding adds
``e = (W_q - W) x``, whose mean over the data, ``E[e]``, is a shift of every output channel. Its mean
over the calibration data is subtracted from the bias, channel by channel, so the INT8 layer's
output has the FP32 layer's mean again.

``E[e]`` is measured exactly, in one pass over the calibration data, on the FP32 model: beside each
layer a copy of it reads the same FP32 input with weight ``DQ(Q(W)) - W`` (the recorded per-channel
INT8 grid) and no bias, so its output is ``e`` itself, free of cancellation against ``y``. Its sum per
sample and channel is accumulated in float64, sample after sample, so the mean does not depend on the
batch size. ``DQ(Q(W)) - W`` is computed by ONNX Runtime at each batch with graph optimizations off,
so no second copy of the weights is held (constant folding would keep one per layer).

Where the correction goes (:class:`BiasCorrection`): a Conv/ConvTranspose's bias ``B`` and a Gemm's
``C`` (divided by ``beta``); a MatMul's bias ``Add`` when its output goes to one Add with a constant
other input. A layer without a bias gets one (Conv, ConvTranspose, Gemm); a bias computed from
constants (a ``Constant`` node, a ``Cast``) is replaced by a new initializer of the corrected values;
a MatMul without a bias Add, a bias computed at run time, or a weight on input 0 is skipped with the
reason (a new Add after a MatMul would be a new node for TensorRT to fuse). The corrections are
applied by :func:`quantdbg.insert_qdq` to the layers it quantizes, and undone by
:func:`quantdbg.qdq.remove_qdq` for the layers a fallback keeps out of INT8, so those compute the
FP32 function again.
"""
from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import onnx
import onnx_graphsurgeon as gs
from onnx import TensorProto, helper, numpy_helper

from quantdbg import _json
from quantdbg.calibration.collect import ActivationStream
from quantdbg.config import TensorKind
from quantdbg.data import DataSource
from quantdbg.errors import ModelError
from quantdbg.model import LoadedModel
from quantdbg.model.external import tensor_array
from quantdbg.model.graph import constant_values, to_graph, trans_b
from quantdbg.model.names import UniqueNames
from quantdbg.model.weights import computed_constants
from quantdbg.placement import QdqPlan, QuantTarget
from quantdbg.quant_math import channel_amax, scale_from_amax

logger = logging.getLogger(__name__)

BiasHeld = Literal["initializer", "computed", "none"]
"""How a corrected layer held its bias: an initializer, a value computed from constants, or none."""

_CORRECTED_OPS = frozenset({"Conv", "ConvTranspose", "Gemm", "MatMul"})


@dataclass(frozen=True, eq=False)
class BiasCorrection(_json.Serializable):
    """The bias correction of one quantized layer.

    Attributes:
        node: The quantized layer.
        owner: The node whose input holds the bias: the layer itself, or the Add after a MatMul.
        input_index: Which input of ``owner`` (2 for Conv/Gemm; the constant input of the Add).
        bias: The tensor the FP32 model reads there (``""``: none).
        held: How the FP32 model held the bias.
        shift: ``E[(W_q - W) x]`` per output channel over the calibration data (float64).
        original: The bias values the FP32 model computes with (None: it has no bias).
        corrected: The bias values the INT8 layer gets: ``original - shift / beta``, broadcast.
    """

    node: str
    owner: str
    input_index: int
    bias: str
    held: BiasHeld
    shift: np.ndarray = field(metadata=_json.json_array(np.float64))
    original: np.ndarray | None = field(metadata=_json.json_array(np.float32))
    corrected: np.ndarray = field(metadata=_json.json_array(np.float32))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, BiasCorrection):
            return NotImplemented
        same = (self.node, self.owner, self.input_index, self.bias, self.held) == \
            (other.node, other.owner, other.input_index, other.bias, other.held)
        arrays = ("shift", "original", "corrected")
        return same and all(_same(getattr(self, f), getattr(other, f)) for f in arrays)

    __hash__ = None  # type: ignore[assignment]  # holds arrays


def _same(a: np.ndarray | None, b: np.ndarray | None) -> bool:
    return (a is None) == (b is None) and (a is None or np.array_equal(a, b))


@dataclass(frozen=True)
class SkippedLayer(_json.Serializable):
    """A quantized layer whose bias was not corrected.

    Attributes:
        node: The layer.
        reason: Why (e.g. a MatMul without a bias Add).
    """

    node: str
    reason: str


@dataclass(frozen=True)
class BiasCorrections(_json.Serializable):
    """Every layer's bias correction, measured in one pass over the calibration data.

    Attributes:
        corrections: One per corrected layer, in graph order.
        skipped: The quantized layers left as they were, with the reason.
        n_batches: Feeds consumed.
        n_samples: Samples consumed.
    """

    corrections: tuple[BiasCorrection, ...] = ()
    skipped: tuple[SkippedLayer, ...] = ()
    n_batches: int = 0
    n_samples: int = 0

    def of(self, node: str) -> BiasCorrection | None:
        """The correction of layer ``node`` (None: not corrected)."""
        return next((c for c in self.corrections if c.node == node), None)


@dataclass
class _Slot:
    """Where one layer's bias lives, before measuring."""

    target: QuantTarget
    owner: gs.Node
    input_index: int
    held: BiasHeld
    original: np.ndarray | None
    divisor: float = 1.0
    channels: int = 0


def _constant_or_computed(tensor: gs.Tensor, computed: dict[str, np.ndarray]) -> tuple[BiasHeld, Any]:
    if isinstance(tensor, gs.Constant):
        return "initializer", np.asarray(constant_values(tensor), np.float32)
    values = constant_values(tensor)
    if values is None:
        values = computed.get(tensor.name)
    return ("computed", np.asarray(values, np.float32)) if values is not None else ("computed", None)


def _slot(node: gs.Node, target: QuantTarget, computed: dict[str, np.ndarray]) -> _Slot | str:
    """Where ``node``'s bias lives, or why it cannot be corrected."""
    if target.input_index != 1:
        return "its weight is input 0 (a constant left operand)"
    if node.op == "MatMul":
        return _matmul_slot(node, target, computed)
    beta = float(node.attrs.get("beta", 1.0)) if node.op == "Gemm" else 1.0
    if beta == 0.0:
        return "Gemm with beta 0 ignores its bias input"
    if len(node.inputs) < 3 or not node.inputs[2].name:
        return _Slot(target, node, 2, "none", None, beta)
    held, values = _constant_or_computed(node.inputs[2], computed)
    if values is None:
        return f"its bias {node.inputs[2].name!r} is computed at run time"
    return _Slot(target, node, 2, held, values, beta)


def _matmul_slot(node: gs.Node, target: QuantTarget, computed: dict[str, np.ndarray]) -> _Slot | str:
    weight = node.inputs[1]
    if weight.shape is None or len(weight.shape) != 2:
        return "a MatMul whose weight is not 2-D"
    out = node.outputs[0]
    reader = out.outputs[0] if len(out.outputs) == 1 else None
    if reader is None or reader.op != "Add" or len(reader.inputs) != 2:
        return "a MatMul without a bias Add (a new Add node would change the graph TensorRT fuses)"
    index = 1 if reader.inputs[0] is out else 0
    held, values = _constant_or_computed(reader.inputs[index], computed)
    n = int(weight.shape[1])
    if values is None or values.ndim == 0 or values.shape[-1] not in (1, n):
        return f"a MatMul whose Add reads no per-channel constant bias (Add {reader.name!r})"
    return _Slot(target, reader, index, held, values)


def _slots(graph: gs.Graph, plan: QdqPlan, proto: onnx.ModelProto) -> tuple[list[_Slot], list[SkippedLayer]]:
    nodes = {n.name: n for n in graph.nodes}
    weights = [t for t in plan.targets if t.kind is TensorKind.WEIGHT and t.op_type in _CORRECTED_OPS]
    biases = [n.inputs[2].name for n in nodes.values() if n.op != "MatMul" and len(n.inputs) > 2]
    adds = [t.name for n in nodes.values() if n.op == "Add" for t in n.inputs]
    computed = computed_constants(proto, [*biases, *adds])
    slots, skipped = [], []
    for target in weights:
        found = _slot(nodes[target.node], target, computed)
        if isinstance(found, str):
            skipped.append(SkippedLayer(target.node, found))
        else:
            slots.append(found)
    return slots, skipped


def _reduction(slot: _Slot, error: str, names: UniqueNames, inits: list[TensorProto]
               ) -> tuple[list[onnx.NodeProto], str]:
    """Nodes summing ``error`` per sample (axis 0) and output channel; returns them and the [N, C] output."""
    base = f"{slot.target.node}/bias_correction"
    if slot.target.op_type == "Gemm":
        return [], error  # [M, N] already
    channels_last = slot.target.op_type == "MatMul"
    shape = numpy_helper.from_array(np.array([0, -1, slot.channels] if channels_last else
                                             [0, slot.channels, -1], np.int64), names(f"{base}/shape"))
    axes = numpy_helper.from_array(np.array([1 if channels_last else 2], np.int64), names(f"{base}/axes"))
    inits += [shape, axes]
    flat, summed = names(f"{base}/flat"), names(f"{base}/sum")
    return [helper.make_node("Reshape", [error, shape.name], [flat], name=names(f"{base}/Reshape")),
            helper.make_node("ReduceSum", [flat, axes.name], [summed], keepdims=0,
                             name=names(f"{base}/ReduceSum"))], summed


def _branch(proto_node: onnx.NodeProto, slot: _Slot, weight: np.ndarray, names: UniqueNames,
            inits: list[TensorProto]) -> tuple[list[onnx.NodeProto], str, str]:
    """The copy of a layer computing ``(DQ(Q(W)) - W) x``; returns its nodes, the sums and shape outputs."""
    target, base = slot.target, f"{slot.target.node}/bias_correction"
    scale = scale_from_amax(channel_amax(weight, target.axis).reshape(-1) if target.axis is not None
                            else channel_amax(weight, None))
    inits.append(numpy_helper.from_array(np.asarray(scale, np.float32), names(f"{base}/scale")))
    inits.append(numpy_helper.from_array(np.zeros(np.shape(scale), np.int8), names(f"{base}/zero_point")))
    axis = {} if target.axis is None else {"axis": target.axis}
    q, dq, delta, error = (names(f"{base}/{n}") for n in ("quantized", "dequantized", "delta", "error"))
    qargs = [target.tensor, inits[-2].name, inits[-1].name]
    copy = onnx.NodeProto()
    copy.CopyFrom(proto_node)
    copy.name = names(f"{base}/{proto_node.op_type}")
    del copy.input[:]
    copy.input.extend([proto_node.input[0], delta])
    del copy.output[:]
    copy.output.append(error)
    nodes = [helper.make_node("QuantizeLinear", qargs, [q], name=names(f"{base}/QuantizeLinear"), **axis),
             helper.make_node("DequantizeLinear", [q, *qargs[1:]], [dq],
                              name=names(f"{base}/DequantizeLinear"), **axis),
             helper.make_node("Sub", [dq, target.tensor], [delta], name=names(f"{base}/Sub")), copy]
    reduce, summed = _reduction(slot, error, names, inits)
    shape = names(f"{base}/error_shape")
    nodes += [*reduce, helper.make_node("Shape", [error], [shape], name=names(f"{base}/Shape"))]
    return nodes, summed, shape


def _channels(slot: _Slot, weight: np.ndarray, proto_node: onnx.NodeProto) -> int:
    op = slot.target.op_type
    if op == "Conv":
        return int(weight.shape[0])
    if op == "ConvTranspose":
        group = next((a.i for a in proto_node.attribute if a.name == "group"), 1)
        return int(weight.shape[1]) * int(group)
    if op == "Gemm":
        return int(weight.shape[0] if trans_b(proto_node) else weight.shape[1])
    return int(weight.shape[-1])


def _measuring_model(proto: onnx.ModelProto, slots: list[_Slot]
                     ) -> tuple[onnx.ModelProto, list[tuple[str, str]]]:
    """A copy of ``proto`` with one error branch per slot; returns it and each slot's outputs."""
    model = onnx.ModelProto()
    model.CopyFrom(proto)
    names = UniqueNames.of_model(model)
    by_name = {n.name: n for n in model.graph.node}
    inits: list[TensorProto] = []
    outputs = []
    for slot in slots:
        node = by_name[slot.target.node]
        weight = _weight_values(model, slot.target)  # one layer's weights at a time
        slot.channels = _channels(slot, weight, node)
        nodes, summed, shape = _branch(node, slot, weight, names, inits)
        model.graph.node.extend(nodes)  # after every node: the branch reads only their outputs
        outputs.append((summed, shape))
    model.graph.initializer.extend(inits)
    return model, outputs


def _weight_values(model: onnx.ModelProto, target: QuantTarget) -> np.ndarray:
    init = next(i for i in model.graph.initializer if i.name == target.tensor)
    return np.asarray(tensor_array(init), np.float32)  # read from its data file when external


def _session_options() -> Any:
    import onnxruntime as ort  # core dependency, imported here to keep `import quantdbg.calibration` cheap

    options = ort.SessionOptions()
    options.use_deterministic_compute = True
    # No constant folding: it would hold DQ(Q(W)) - W as a second float copy of every weight.
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return options


class _Means:
    """Per-channel sums of the rounding error, accumulated sample after sample in float64."""

    def __init__(self, slots: list[_Slot]) -> None:
        self.sums = [np.zeros(slot.channels) for slot in slots]
        self.counts = [0] * len(slots)

    def update(self, index: int, summed: np.ndarray, shape: np.ndarray) -> None:
        rows = np.asarray(summed, np.float64).reshape(-1, self.sums[index].size)
        # cumsum adds the rows one after the other: the same sums whatever the batch size
        self.sums[index] = np.cumsum(np.vstack([self.sums[index][None], rows]), axis=0)[-1]
        self.counts[index] += int(np.prod(shape)) // self.sums[index].size

    def mean(self, index: int) -> np.ndarray:
        return self.sums[index] / max(self.counts[index], 1)


def correct_biases(model: LoadedModel, data: DataSource, plan: QdqPlan, *, max_batches: int | None = None,
                   progress: bool = False) -> BiasCorrections:
    """Measures the bias correction of every weighted layer ``plan`` quantizes (module docstring).

    Args:
        model: The FP32 model the plan was made on (not modified).
        data: Calibration data; iterated once.
        plan: The Q/DQ plan: its weight targets say which layers, and their per-channel axes.
        max_batches: Stop after this many feeds (None: all).
        progress: Show a progress bar.

    Returns:
        The corrections, in graph order, and the layers skipped with the reason.

    Raises:
        DataError: A feed does not match the model, or there is no data.
        BackendError: ONNX Runtime failed.
    """
    slots, skipped = _slots(to_graph(model.proto), plan, model.proto)
    if not slots:
        return BiasCorrections((), tuple(skipped))
    measuring, outputs = _measuring_model(model.proto, slots)
    stream = ActivationStream(measuring, [name for pair in outputs for name in pair], "bias correction",
                              _session_options())
    means = _Means(slots)
    for arrays in stream.batches(data, max_batches, progress):
        for index, (summed, shape) in enumerate(outputs):
            means.update(index, arrays[summed], arrays[shape])
    corrections = tuple(_correction(slot, means.mean(i)) for i, slot in enumerate(slots))
    logger.info("bias correction: %d layer(s) corrected, %d skipped", len(corrections), len(skipped))
    return BiasCorrections(corrections, tuple(skipped), stream.n_batches, stream.n_samples)


def _correction(slot: _Slot, shift: np.ndarray) -> BiasCorrection:
    base = np.zeros(slot.channels) if slot.original is None else np.asarray(slot.original, np.float64)
    corrected = (base - shift / slot.divisor).astype(np.float32)  # channels on the last axis
    bias = slot.owner.inputs[slot.input_index].name if slot.input_index < len(slot.owner.inputs) else ""
    return BiasCorrection(slot.target.node, slot.owner.name, slot.input_index, bias, slot.held, shift,
                          slot.original, corrected)


def apply_bias_corrections(graph: gs.Graph, corrections: BiasCorrections, layers: Iterable[str],
                           names: UniqueNames) -> None:
    """Gives each of ``layers`` that has a correction its corrected bias, as a new initializer (in place).

    Args:
        graph: The model being quantized (node names as in the model the corrections were measured on).
        corrections: From :func:`correct_biases`.
        layers: The layers quantized (the others keep the FP32 bias).
        names: Fresh names.

    Raises:
        ModelError: A corrected bias is not where the correction was measured (another model).
    """
    nodes = {n.name: n for n in graph.nodes}
    wanted = set(layers)
    for c in corrections.corrections:
        if c.node in wanted:
            owner = _owner(nodes, c)
            _set_input(owner, c.input_index, gs.Constant(names(f"{c.node}/bias_corrected"), c.corrected))


def restore_bias(graph: gs.Graph, correction: BiasCorrection, names: UniqueNames) -> None:
    """Gives a corrected layer its FP32 bias back (in place): the values it had, or no bias at all."""
    owner = next(n for n in graph.nodes if n.name == correction.owner)
    if correction.original is None:
        while len(owner.inputs) > correction.input_index:  # gs lists take no slice deletion
            owner.inputs.pop()
        return
    owner.inputs[correction.input_index] = gs.Constant(names(correction.bias), correction.original)


def _owner(nodes: dict[str, gs.Node], c: BiasCorrection) -> gs.Node:
    owner = nodes.get(c.owner)
    found = (owner.inputs[c.input_index].name if owner is not None and c.input_index < len(owner.inputs)
             else "")
    if owner is None or found != c.bias:
        raise ModelError(f"The bias correction of layer {c.node!r} was measured with bias "
                         f"{c.bias or '(none)'!r} at input {c.input_index} of node {c.owner!r}, which this "
                         f"model does not have ({found or 'none'!r}); calibrate this model again.")
    return owner


def _set_input(node: gs.Node, index: int, tensor: gs.Tensor) -> None:
    if index < len(node.inputs):
        node.inputs[index] = tensor
    else:
        node.inputs.append(tensor)  # a Conv or Gemm without bias: the bias is the next input


__all__ = ["BiasCorrection", "BiasCorrections", "BiasHeld", "SkippedLayer", "apply_bias_corrections",
           "correct_biases", "restore_bias"]
