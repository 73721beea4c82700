"""Graphs built for sensitivity analysis, so each sweep runs in one ONNX Runtime session.

* :func:`switch_graph`: the Q/DQ model with every recorded pair behind
  ``If(enable_<layer>, DQ(Q(x)), x)``; a boolean graph input per layer turns its pairs on or
  off, so every isolated / leave-one-out / fallback variant is only a different feed.
* :func:`local_graph`: the FP32 model plus, per layer (and per candidate range), a clone of the
  layer reading Q/DQ copies of its FP32 inputs; in-graph reductions return the clone's output
  error, so one pass gives every layer's local error and no activation leaves the session;
* :func:`paired_graph`: the FP32 model and the (switchable) quantized model side by side in one
  graph, with reductions comparing paired tensors -- the cumulative comparison in one pass.

The link between a layer and its pairs always comes from the QdqRecords, never from names.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from quantdbg.config import TensorKind
from quantdbg.errors import ModelError
from quantdbg.model.external import tensor_array
from quantdbg.model.names import UniqueNames
from quantdbg.qdq import QdqRecord, QuantizedModel
from quantdbg.quant_math import scale_from_amax
from quantdbg.sensitivity.bias_switch import switch_biases
from quantdbg.sensitivity.lazy_pairs import copy_pair, dequantize_per_run, lazy_pair

ENABLE_PREFIX = "quantdbg_enable/"
LOCAL_SUFFIX = "/quantdbg_local"
REDUCTIONS = ("signal", "noise", "test", "max", "min", "count")
"""The scalars reported per compared tensor: sum r^2, sum (t-r)^2, sum t^2, max (t-r), min (t-r)
(float32) and the element count (int64)."""


def _copy(model: onnx.ModelProto) -> onnx.ModelProto:
    out = onnx.ModelProto()
    out.CopyFrom(model)
    return out


def _nodes_by_name(model: onnx.ModelProto) -> dict[str, onnx.NodeProto]:
    return {node.name: node for node in model.graph.node}


def _constant(model: onnx.ModelProto, name: str) -> np.ndarray | None:
    """Values of an initializer or a Constant node's output named ``name``."""
    for init in model.graph.initializer:
        if init.name == name:
            return tensor_array(init)
    for node in model.graph.node:
        if node.op_type == "Constant" and node.output[0] == name:
            for attr in node.attribute:
                if attr.name == "value":
                    return tensor_array(attr.t)
    return None


@dataclass(frozen=True)
class SwitchGraph:
    """The Q/DQ model with one boolean switch input per quantized layer.

    Attributes:
        model: The model; its inputs are the original ones plus one scalar bool per layer.
        switches: Layer name -> its switch input's name, in graph order.
    """

    model: onnx.ModelProto
    switches: Mapping[str, str]

    @property
    def layers(self) -> tuple[str, ...]:
        """Quantized layers, in graph order."""
        return tuple(self.switches)

    def feed(self, quantized: Iterable[str]) -> dict[str, np.ndarray]:
        """Switch values that quantize exactly the layers in ``quantized``."""
        on = set(quantized)
        return {name: np.array(layer in on) for layer, name in self.switches.items()}


def fp32_weight(fp_model: onnx.ModelProto, record: QdqRecord) -> np.ndarray | None:
    """The FP32 values of a weight record, from the FP32 model.

    A model quantized elsewhere may store the weight as INT8 under another name (ONNX Runtime's
    ``w_quantized``); the FP32 values are then the FP32 model's input of the same node at the same
    input index (node identity, not a name suffix).
    """
    values = _constant(fp_model, record.tensor)
    if values is not None and np.issubdtype(values.dtype, np.floating):
        return values
    node = next((n for n in fp_model.graph.node if n.name == record.node), None)
    if node is None or len(node.input) <= record.input_index:
        return None
    values = _constant(fp_model, node.input[record.input_index])
    return values if values is not None and np.issubdtype(values.dtype, np.floating) else None


def _fp32_weight(fp_model: onnx.ModelProto, record: QdqRecord) -> np.ndarray:
    values = fp32_weight(fp_model, record)
    if values is None:
        raise ModelError(f"Weight {record.tensor!r} of node {record.node!r} is stored as INT8 in the Q/DQ "
                         "model and the FP32 model has no FP32 initializer for that input of the node; pass "
                         "the FP32 original the Q/DQ model was made from.")
    return values


def _fp_source(qmodel: QuantizedModel, fp_model: onnx.ModelProto, record: QdqRecord,
               nodes: Mapping[str, onnx.NodeProto], names: UniqueNames,
               added: list[onnx.TensorProto]) -> str:
    """Name of the FP32 tensor a record's pair quantizes, inside the Q/DQ model."""
    if record.quantize_node is not None:
        q = nodes.get(record.quantize_node)
        if q is None or q.op_type != "QuantizeLinear":
            raise ModelError(f"QuantizeLinear {record.quantize_node!r} recorded for node {record.node!r} "
                             "is not in the Q/DQ model; rebuild the records with records_from_model().")
        return q.input[0]
    tensor = numpy_helper.from_array(_fp32_weight(fp_model, record), names(f"{record.tensor}/fp32"))
    added.append(tensor)
    return tensor.name


def _dq_output(record: QdqRecord, nodes: Mapping[str, onnx.NodeProto]) -> str:
    dq = nodes.get(record.dequantize_node)
    consumer = nodes.get(record.node)
    if dq is None or consumer is None or len(consumer.input) <= record.input_index \
            or consumer.input[record.input_index] != dq.output[0]:
        raise ModelError(f"Input {record.input_index} of node {record.node!r} is not fed by DequantizeLinear "
                         f"{record.dequantize_node!r} as its record says; the model was edited after "
                         "quantization. Rebuild the records with records_from_model().")
    return dq.output[0]


def _folded_weight(model: onnx.ModelProto, record: QdqRecord, nodes: Mapping[str, onnx.NodeProto],
                   source: str) -> np.ndarray | None:
    """DQ(Q(w)) of a constant weight, computed as ONNX defines it; None when not all constant."""
    dq = nodes[record.dequantize_node]
    scale = _constant(model, dq.input[1])
    zero = _constant(model, dq.input[2]) if len(dq.input) > 2 and dq.input[2] else None
    if scale is None:
        return None
    zero = np.zeros(scale.shape, np.int8) if zero is None else zero
    if record.quantize_node is not None:
        weight = _constant(model, source)
        if weight is None:
            return None
        shaped_scale, shaped_zero = _broadcastable(scale, zero, dq, weight.ndim)
        info = np.iinfo(zero.dtype)
        ints = np.clip(np.round(weight.astype(np.float32) / shaped_scale) + shaped_zero, info.min, info.max)
    else:
        ints = _constant(model, dq.input[0])
        if ints is None:
            return None
        shaped_scale, shaped_zero = _broadcastable(scale, zero, dq, ints.ndim)
    return ((ints.astype(np.float32) - shaped_zero.astype(np.float32)) * shaped_scale).astype(np.float32)


def _broadcastable(scale: np.ndarray, zero: np.ndarray, dq: onnx.NodeProto,
                   ndim: int) -> tuple[np.ndarray, np.ndarray]:
    if scale.ndim == 0 or scale.size == 1 and not any(a.name == "axis" for a in dq.attribute):
        return scale.astype(np.float32).reshape(()), zero.reshape(())
    axis = next((a.i for a in dq.attribute if a.name == "axis"), 1) % ndim
    shape = [1] * ndim
    shape[axis] = scale.size
    return scale.astype(np.float32).reshape(shape), zero.reshape(shape)


def _subgraph_reads(node: onnx.NodeProto) -> set[str]:
    """Names read inside the subgraphs of If/Loop/Scan (outer-scope values they may capture)."""
    reads: set[str] = set()
    for attr in node.attribute:
        for graph in (*([attr.g] if attr.HasField("g") else []), *attr.graphs):
            for inner in graph.node:
                reads.update(inner.input)
                reads.update(_subgraph_reads(inner))
    return reads


def _prune_dead(model: onnx.ModelProto) -> None:
    """Drops nodes none of whose outputs is read (e.g. weight Q/DQ replaced by folded constants)."""
    needed = {o.name for o in model.graph.output}
    kept = []
    for node in reversed(model.graph.node):
        if any(out and out in needed for out in node.output):
            kept.append(node)
            needed.update(node.input)
            needed.update(_subgraph_reads(node))
    del model.graph.node[:]
    model.graph.node.extend(reversed(kept))
    used = needed | {i.name for i in model.graph.input}
    inits = [init for init in model.graph.initializer if init.name in used]
    del model.graph.initializer[:]
    model.graph.initializer.extend(inits)


def _branch(name: str, nodes: list[onnx.NodeProto], output: str, elem_type: int) -> onnx.GraphProto:
    return helper.make_graph(nodes, name, [], [helper.make_tensor_value_info(output, elem_type, None)])


def _clamps_negatives(record: QdqRecord, zero_dtype: np.dtype | None) -> bool:
    """True when the pair's representable range is [0, ...] (zero point at the type's minimum)."""
    if zero_dtype is None or not record.zero_point or not np.issubdtype(zero_dtype, np.integer):
        return False
    return all(z == np.iinfo(zero_dtype).min for z in record.zero_point)


def _switch_node(record: QdqRecord, switch: str, source: str, quantized: onnx.NodeProto | str,
                 q_node: onnx.NodeProto | None, out: str, names: UniqueNames, elem_type: int,
                 zero_dtype: np.dtype | None) -> onnx.NodeProto:
    """``If(switch)``: the quantized value (a folded constant, or Q/DQ computed only when on), else
    the FP32 source. Unlike ``Where`` the off branch never runs Q/DQ and a branch costs one copy."""
    base = f"{record.node}/input{record.input_index}/switch"
    on_out, off_out = names(f"{base}/on"), names(f"{base}/off")
    if isinstance(quantized, str):  # folded weight
        on_nodes = [helper.make_node("Identity", [quantized], [on_out], name=names(f"{base}/OnIdentity"))]
    else:
        dq = onnx.NodeProto()
        dq.CopyFrom(quantized)
        dq.name, dq.output[0] = names(f"{base}/DequantizeLinear"), on_out
        on_nodes = [dq]
        if q_node is not None:
            q = onnx.NodeProto()
            q.CopyFrom(q_node)
            q.name, q.output[0] = names(f"{base}/QuantizeLinear"), names(f"{base}/quantized")
            q.input[0] = source
            dq.input[0] = q.output[0]
            on_nodes.insert(0, q)
    # A pair whose range starts exactly at 0 also clamps negatives: ONNX Runtime's quantizer folds a
    # Relu into such a pair and deletes the Relu, so "off" must keep the clamp to stay FP32-equivalent.
    clamps = record.kind is TensorKind.ACTIVATION and _clamps_negatives(record, zero_dtype)
    op = "Relu" if clamps else "Identity"
    off = [helper.make_node(op, [source], [off_out], name=names(f"{base}/Off{op}"))]
    return helper.make_node("If", [switch], [out], name=names(f"{record.node}/switch"),
                            then_branch=_branch(f"{base}/then", on_nodes, on_out, elem_type),
                            else_branch=_branch(f"{base}/else", off, off_out, elem_type))


def switch_graph(qmodel: QuantizedModel, fp_model: onnx.ModelProto) -> SwitchGraph:
    """Puts every recorded pair behind a per-layer boolean switch: ``If(switch, DQ(Q(x)), x)``.

    A constant weight's pair is computed once, not at every run: folded here (``DQ(Q(w))`` as ONNX
    defines it). A weight left in its data file keeps its pair in the If's branch instead, where
    ONNX Runtime folds ``Q(w)`` into an INT8 constant at session creation and dequantizes it when
    the branch runs (:func:`~quantdbg.sensitivity.lazy_pairs.dequantize_per_run`): same values, and
    the session holds the weight once in FP32 and once in INT8.

    Args:
        qmodel: The Q/DQ model and its records.
        fp_model: The FP32 original (only read for weights stored as INT8 without their FP32
            values).

    Returns:
        The switchable model; all switches on reproduces ``qmodel``, all off the FP32 model.

    Raises:
        ModelError: A record does not match the model.
    """
    model = _copy(qmodel.model)
    names = UniqueNames.of_model(model)
    nodes = _nodes_by_name(model)
    types = float_value_types(model)
    switches = {layer: names(f"{ENABLE_PREFIX}{layer}") for layer in qmodel.layers}
    added: list[onnx.TensorProto] = []
    ifs: dict[str, list[onnx.NodeProto]] = {}
    for record in qmodel.records:
        dq_out = _dq_output(record, nodes)
        source = _fp_source(qmodel, fp_model, record, nodes, names, added)
        quantized: onnx.NodeProto | str = nodes[record.dequantize_node]
        branch = ifs.setdefault(record.node, [])
        if record.kind is TensorKind.WEIGHT and lazy_pair(model, record, nodes):
            scale, quantized = dequantize_per_run(nodes[record.dequantize_node], switches[record.node], names)
            branch.append(scale)
        elif record.kind is TensorKind.WEIGHT:
            folded = _folded_weight(model, record, nodes, source)
            if folded is not None:
                added.append(numpy_helper.from_array(folded, names(f"{record.tensor}/fake_quantized")))
                quantized = added[-1].name
        q_node = nodes.get(record.quantize_node) if record.quantize_node else None
        out = names(f"{dq_out}/switched")
        dq = nodes[record.dequantize_node]
        zero = _constant(model, dq.input[2]) if len(dq.input) > 2 and dq.input[2] else None
        branch.append(_switch_node(
            record, switches[record.node], source, quantized, q_node, out, names,
            types.get(dq_out, TensorProto.FLOAT), None if zero is None else zero.dtype))
        nodes[record.node].input[record.input_index] = out
    switch_biases(qmodel, nodes, switches, names, added, ifs)
    ordered: list[onnx.NodeProto] = []
    for node in model.graph.node:
        ordered.extend(ifs.get(node.name, ()))  # just before their consumer: still topological
        ordered.append(node)
    del model.graph.node[:]
    model.graph.node.extend(ordered)
    model.graph.initializer.extend(added)
    _prune_dead(model)
    model.graph.input.extend(helper.make_tensor_value_info(name, TensorProto.BOOL, [])
                             for name in switches.values())
    return SwitchGraph(model, switches)


@dataclass(frozen=True)
class LocalVariant:
    """One clone of a layer in the local graph.

    Attributes:
        layer: The layer's node name.
        label: What the clone tests, e.g. ``"recorded"`` or a calibrator name.
        activation_amax: Input index -> amax replacing the recorded activation range (symmetric
            INT8, scale ``amax / 127``); inputs not listed keep their recorded pair.
    """

    layer: str
    label: str
    activation_amax: Mapping[int, float]


@dataclass(frozen=True)
class LocalGraph:
    """The FP32 model plus quantized clones of layers and their error reductions.

    Attributes:
        model: The model; its extra outputs are float64 scalars.
        outputs: (variant index, layer output index) -> the names of the :data:`REDUCTIONS`.
        variants: The clones, in the order of ``outputs``' first key.
    """

    model: onnx.ModelProto
    outputs: Mapping[tuple[int, int], tuple[str, ...]]
    variants: tuple[LocalVariant, ...]


def _qdq_nodes(qmodel: QuantizedModel, record: QdqRecord, source: str, amax: float | None,
               names: UniqueNames) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto], str]:
    """Q/DQ of ``source`` with the record's parameters (or a symmetric ``amax``)."""
    base = f"{record.node}/input{record.input_index}{LOCAL_SUFFIX}"
    zp_dtype = _zero_point_dtype(qmodel, record)
    if amax is None:
        scale = np.asarray(record.scale, np.float32)
        zero = np.asarray(record.zero_point or (0,) * len(record.scale)).astype(zp_dtype)
        if record.axis is None:
            scale, zero = scale.reshape(()), zero.reshape(())
    else:
        scale = scale_from_amax(amax)
        zero = np.zeros((), np.int8)
    attrs: dict[str, Any] = {} if record.axis is None or amax is not None else {"axis": record.axis}
    inits = [numpy_helper.from_array(scale, names(f"{base}/scale")),
             numpy_helper.from_array(zero, names(f"{base}/zero_point"))]
    quantized, out = names(f"{base}/quantized"), names(f"{base}/dequantized")
    nodes = [helper.make_node("QuantizeLinear", [source, inits[0].name, inits[1].name], [quantized],
                              name=names(f"{base}/QuantizeLinear"), **attrs),
             helper.make_node("DequantizeLinear", [quantized, inits[0].name, inits[1].name], [out],
                              name=names(f"{base}/DequantizeLinear"), **attrs)]
    return nodes, inits, out


def _local_weight(qmodel: QuantizedModel, record: QdqRecord, q_nodes: Mapping[str, onnx.NodeProto],
                  names: UniqueNames, inits: list[onnx.TensorProto]) -> str | None:
    """Adds the record's fake-quantized weight as a constant; None when it is not constant."""
    q = q_nodes.get(record.quantize_node) if record.quantize_node else None
    values = _folded_weight(qmodel.model, record, q_nodes, q.input[0] if q is not None else "")
    if values is None:
        return None
    inits.append(numpy_helper.from_array(values, names(f"{record.tensor}{LOCAL_SUFFIX}/fake_quantized")))
    return inits[-1].name


def _zero_point_dtype(qmodel: QuantizedModel, record: QdqRecord) -> np.dtype:
    dq = _nodes_by_name(qmodel.model).get(record.dequantize_node)
    if dq is not None and len(dq.input) > 2 and dq.input[2]:
        values = _constant(qmodel.model, dq.input[2])
        if values is not None:
            return values.dtype
    return np.dtype(np.int8)


def _reductions(ref: str, test: str, names: UniqueNames,
                base: str) -> tuple[list[onnx.NodeProto], tuple[str, ...]]:
    """The :data:`REDUCTIONS` of a test tensor against its reference.

    Sums run in float32 inside the graph (casting every compared tensor to float64 would cost
    more than the layer itself) and are accumulated across batches in float64 by the caller;
    ``sum r*t`` is recovered there as ``(sum r^2 + sum t^2 - sum (t-r)^2) / 2`` and max |t-r| from
    the max and min of ``t-r``, which saves two full passes over each tensor.
    """
    diff = names(f"{base}/diff")
    outs = tuple(names(f"{base}/{s}") for s in REDUCTIONS)
    nodes = [
        helper.make_node("Sub", [test, ref], [diff], name=names(f"{base}/Sub")),
        helper.make_node("ReduceSumSquare", [ref], [outs[0]], keepdims=0, name=names(f"{base}/Signal")),
        helper.make_node("ReduceSumSquare", [diff], [outs[1]], keepdims=0, name=names(f"{base}/Noise")),
        helper.make_node("ReduceSumSquare", [test], [outs[2]], keepdims=0, name=names(f"{base}/Test")),
        helper.make_node("ReduceMax", [diff], [outs[3]], keepdims=0, name=names(f"{base}/Max")),
        helper.make_node("ReduceMin", [diff], [outs[4]], keepdims=0, name=names(f"{base}/Min")),
        helper.make_node("Size", [ref], [outs[5]], name=names(f"{base}/Count")),
    ]
    return nodes, outs


def local_graph(fp_model: onnx.ModelProto, qmodel: QuantizedModel,
                variants: Sequence[LocalVariant]) -> LocalGraph:
    """Builds the FP32 model with quantized clones of layers that report their output error.

    Each clone reads the FP32 model's own inputs of the layer, passed through Q/DQ pairs with the
    recorded parameters (or a variant's activation range), so its error is the layer's local
    error, free of upstream quantization error.

    Args:
        fp_model: The FP32 model (node names as in ``qmodel``).
        qmodel: The Q/DQ model's records (and constants for stored-INT8 weights).
        variants: The clones to build.

    Returns:
        The graph and where each clone's reductions are.

    Raises:
        ModelError: A layer is not a node of ``fp_model``.
    """
    builder = _LocalBuilder(fp_model, qmodel)
    extra_nodes: dict[str, list[onnx.NodeProto]] = {}
    for index, variant in enumerate(variants):
        node = builder.fp_nodes.get(variant.layer)
        if node is None:
            raise ModelError(f"Quantized node {variant.layer!r} is not in the FP32 model; pass the FP32 "
                             "original of the Q/DQ model (node names must match).")
        extra_nodes.setdefault(node.name, []).extend(builder.clone(index, variant, node))
    model = builder.model
    _append_after(model, extra_nodes)
    model.graph.initializer.extend(builder.inits)
    _add_reduction_outputs(model, builder.outputs.values())
    return LocalGraph(model, builder.outputs, tuple(variants))


class _LocalBuilder:
    """The state :func:`local_graph` builds up: the FP32 copy, names, constants and reductions."""

    def __init__(self, fp_model: onnx.ModelProto, qmodel: QuantizedModel) -> None:
        self.model = _copy(fp_model)
        self.qmodel = qmodel
        self.names = UniqueNames.of_model(self.model)
        self.fp_nodes = _nodes_by_name(self.model)
        self.inits: list[onnx.TensorProto] = []
        self.outputs: dict[tuple[int, int], tuple[str, ...]] = {}
        self.float_outputs = _float_tensors(self.model)
        self.q_nodes = _nodes_by_name(qmodel.model)
        self.folded: dict[tuple[str, int], str | None] = {}

    def clone(self, index: int, variant: LocalVariant, node: onnx.NodeProto) -> list[onnx.NodeProto]:
        """The nodes of one clone: the Q/DQ it reads, the clone, then its reductions."""
        clone = onnx.NodeProto()
        clone.CopyFrom(node)
        clone.name = self.names(f"{node.name}{LOCAL_SUFFIX}")
        added = self._quantized_inputs(variant, node, clone)
        added.append(clone)  # after the Q/DQ it reads, before the reductions that read it
        for k, out_name in enumerate(node.output):
            if not out_name:
                continue
            clone.output[k] = self.names(f"{out_name}{LOCAL_SUFFIX}")
            if out_name in self.float_outputs:
                red, outs = _reductions(out_name, clone.output[k], self.names,
                                        f"{clone.name}/{variant.label}/out{k}")
                added += red
                self.outputs[(index, k)] = outs
        return added

    def _quantized_inputs(self, variant: LocalVariant, node: onnx.NodeProto,
                          clone: onnx.NodeProto) -> list[onnx.NodeProto]:
        """Points the clone's quantized inputs at fake-quantized weights and Q/DQ'd activations."""
        added: list[onnx.NodeProto] = []
        for record in self.qmodel.records_of(variant.layer):
            source = node.input[record.input_index] if len(node.input) > record.input_index else ""
            if source != record.tensor and record.kind is TensorKind.ACTIVATION:
                raise ModelError(f"Input {record.input_index} of node {variant.layer!r} in the FP32 model is "
                                 f"{source!r}, but the Q/DQ record says {record.tensor!r}; pass the FP32 "
                                 "original the Q/DQ model was made from.")
            key = (record.node, record.input_index)
            if record.kind is TensorKind.WEIGHT and key not in self.folded:
                self.folded[key] = copy_pair(self.qmodel.model, record, self.names, added, self.inits) \
                    if lazy_pair(self.qmodel.model, record, self.q_nodes) \
                    else _local_weight(self.qmodel, record, self.q_nodes, self.names, self.inits)
            folded = self.folded.get(key)
            if folded:  # weights: fake-quantized once, shared by every clone of the layer
                clone.input[record.input_index] = folded
                continue
            amax = variant.activation_amax.get(record.input_index)
            qdq, consts, out = _qdq_nodes(self.qmodel, record, source, amax, self.names)
            added += qdq
            self.inits += consts
            clone.input[record.input_index] = out
        return added


def _add_reduction_outputs(model: onnx.ModelProto, groups: Iterable[tuple[str, ...]]) -> None:
    """Declares every reduction as a graph output (float32 scalars; the count is int64)."""
    model.graph.output.extend(
        helper.make_tensor_value_info(name, TensorProto.INT64 if kind == "count" else TensorProto.FLOAT, [])
        for outs in groups for kind, name in zip(REDUCTIONS, outs, strict=True))


def _append_after(model: onnx.ModelProto, extra: Mapping[str, list[onnx.NodeProto]]) -> None:
    """Re-orders the graph so each layer's added nodes follow the layer (topological order)."""
    ordered = []
    for node in model.graph.node:
        ordered.append(node)
        ordered.extend(extra.get(node.name, ()))
    del model.graph.node[:]
    model.graph.node.extend(ordered)


def _float_tensors(model: onnx.ModelProto) -> set[str]:
    """Names of float32 values known from shape inference (plus graph inputs/outputs)."""
    values = (*model.graph.value_info, *model.graph.input, *model.graph.output)
    return {v.name for v in values if v.type.tensor_type.elem_type == TensorProto.FLOAT}


def float_value_types(model: onnx.ModelProto) -> dict[str, int]:
    """Value name -> ONNX element type, from the model's value_info, inputs and outputs."""
    values = (*model.graph.value_info, *model.graph.input, *model.graph.output)
    return {v.name: v.type.tensor_type.elem_type for v in values}


@dataclass(frozen=True)
class PairedGraph:
    """The FP32 and quantized models in one graph, with error reductions of paired tensors.

    Attributes:
        model: The merged model. Its inputs are the FP32 model's plus the switches; its outputs
            the FP32 outputs, the quantized outputs (``quant_outputs``) and the reductions.
        reductions: FP32 tensor name -> the names of its :data:`REDUCTIONS`.
        quant_outputs: FP32 output name -> name of the quantized model's same output.
    """

    model: onnx.ModelProto
    reductions: Mapping[str, tuple[str, ...]]
    quant_outputs: Mapping[str, str]


QUANT_PREFIX = "quantdbg_quant/"


def _rename_graph(graph: onnx.GraphProto, rename: dict[str, str], keep: set[str]) -> None:
    """Prefixes every value and node name of ``graph`` (and its subgraphs) except ``keep``."""
    def new(name: str) -> str:
        if not name or name in keep:
            return name
        return rename.setdefault(name, QUANT_PREFIX + name)

    for init in graph.initializer:
        init.name = new(init.name)
    for info in (*graph.value_info, *graph.output):
        info.name = new(info.name)
    for node in graph.node:
        node.name = QUANT_PREFIX + node.name if node.name else node.name
        for i, name in enumerate(node.input):
            node.input[i] = new(name)
        for i, name in enumerate(node.output):
            node.output[i] = new(name)
        for attr in node.attribute:
            for sub in (*([attr.g] if attr.HasField("g") else []), *attr.graphs):
                for info in sub.input:
                    info.name = new(info.name)
                _rename_graph(sub, rename, keep)


def paired_graph(fp_model: onnx.ModelProto, quant_model: onnx.ModelProto,
                 pairs: Mapping[str, str]) -> PairedGraph:
    """Puts both models in one graph and compares ``pairs`` (FP32 tensor -> quantized tensor).

    Args:
        fp_model: The FP32 model.
        quant_model: The quantized model (e.g. :attr:`SwitchGraph.model`) with the same data
            inputs; its extra inputs (switches) become inputs of the merged graph.
        pairs: FP32 value name -> the quantized model's value holding the same quantity.

    Returns:
        The merged graph.
    """
    model = _copy(fp_model)
    quant = _copy(quant_model)
    shared = {i.name for i in model.graph.input}
    rename: dict[str, str] = {}
    _rename_graph(quant.graph, rename, shared | {i.name for i in quant.graph.input})
    quant_outputs = {fp.name: q.name for fp, q in zip(model.graph.output, quant.graph.output, strict=True)}
    model.graph.node.extend(quant.graph.node)
    model.graph.initializer.extend(quant.graph.initializer)
    model.graph.value_info.extend(quant.graph.value_info)
    model.graph.input.extend(i for i in quant.graph.input if i.name not in shared)
    model.graph.output.extend(quant.graph.output)
    names = UniqueNames.of_model(model)
    reductions: dict[str, tuple[str, ...]] = {}
    for fp_name, q_name in pairs.items():
        nodes, outs = _reductions(fp_name, rename.get(q_name, q_name), names, f"quantdbg_pair/{fp_name}")
        model.graph.node.extend(nodes)
        reductions[fp_name] = outs
    _add_reduction_outputs(model, reductions.values())
    return PairedGraph(model, reductions, quant_outputs)
