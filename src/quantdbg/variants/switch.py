"""The switchable graph: the Q/DQ model with every recorded pair behind a per-layer switch.

:func:`switch_graph` puts each recorded pair behind ``If(enable_<layer>, DQ(Q(x)), x)``; a boolean
graph input per layer turns its pairs on or off, so every isolated / leave-one-out / fallback
variant is only a different feed. The link between a layer and its pairs always comes from the
QdqRecords, never from names.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from quantdbg.config import TensorKind
from quantdbg.errors import ModelError
from quantdbg.model.graph import copy_model, nodes_by_name, proto_constant, value_types
from quantdbg.model.names import UniqueNames
from quantdbg.qdq import QdqRecord, QuantizedModel
from quantdbg.variants.bias_switch import switch_biases
from quantdbg.variants.lazy_pairs import dequantize_per_run, lazy_pair

ENABLE_PREFIX = "quantdbg_enable/"


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
    values = proto_constant(fp_model, record.tensor)
    if values is not None and np.issubdtype(values.dtype, np.floating):
        return values
    node = next((n for n in fp_model.graph.node if n.name == record.node), None)
    if node is None or len(node.input) <= record.input_index:
        return None
    values = proto_constant(fp_model, node.input[record.input_index])
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


def folded_weight(model: onnx.ModelProto, record: QdqRecord, nodes: Mapping[str, onnx.NodeProto],
                  source: str) -> np.ndarray | None:
    """DQ(Q(w)) of a constant weight, computed as ONNX defines it; None when not all constant."""
    dq = nodes[record.dequantize_node]
    scale = proto_constant(model, dq.input[1])
    zero = proto_constant(model, dq.input[2]) if len(dq.input) > 2 and dq.input[2] else None
    if scale is None:
        return None
    zero = np.zeros(scale.shape, np.int8) if zero is None else zero
    if record.quantize_node is not None:
        weight = proto_constant(model, source)
        if weight is None:
            return None
        shaped_scale, shaped_zero = _broadcastable(scale, zero, dq, weight.ndim)
        info = np.iinfo(zero.dtype)
        ints = np.clip(np.round(weight.astype(np.float32) / shaped_scale) + shaped_zero, info.min, info.max)
    else:
        ints = proto_constant(model, dq.input[0])
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
    the branch runs (:func:`~quantdbg.variants.lazy_pairs.dequantize_per_run`): same values, and
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
    model = copy_model(qmodel.model)
    names = UniqueNames.of_model(model)
    nodes = nodes_by_name(model)
    types = value_types(model)
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
            folded = folded_weight(model, record, nodes, source)
            if folded is not None:
                added.append(numpy_helper.from_array(folded, names(f"{record.tensor}/fake_quantized")))
                quantized = added[-1].name
        q_node = nodes.get(record.quantize_node) if record.quantize_node else None
        out = names(f"{dq_out}/switched")
        dq = nodes[record.dequantize_node]
        zero = proto_constant(model, dq.input[2]) if len(dq.input) > 2 and dq.input[2] else None
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


