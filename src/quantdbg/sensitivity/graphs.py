"""Graphs built for sensitivity analysis, so each sweep runs in one ONNX Runtime session.

* :func:`~quantdbg.variants.switch.switch_graph` (in :mod:`quantdbg.variants`): the Q/DQ model
  with every recorded pair behind ``If(enable_<layer>, DQ(Q(x)), x)``; a boolean graph input per
  layer turns its pairs on or off, so every isolated / leave-one-out / fallback variant is only a
  different feed.
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
from quantdbg.model.graph import copy_model, float_tensors, nodes_by_name, proto_constant
from quantdbg.model.names import UniqueNames
from quantdbg.qdq import QdqRecord, QuantizedModel
from quantdbg.quant_math import scale_from_amax
from quantdbg.variants.lazy_pairs import copy_pair, lazy_pair
from quantdbg.variants.switch import folded_weight

LOCAL_SUFFIX = "/quantdbg_local"
REDUCTIONS = ("signal", "noise", "test", "max", "min", "count")
"""The scalars reported per compared tensor: sum r^2, sum (t-r)^2, sum t^2, max (t-r), min (t-r)
(float32) and the element count (int64)."""


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
    values = folded_weight(qmodel.model, record, q_nodes, q.input[0] if q is not None else "")
    if values is None:
        return None
    inits.append(numpy_helper.from_array(values, names(f"{record.tensor}{LOCAL_SUFFIX}/fake_quantized")))
    return inits[-1].name


def _zero_point_dtype(qmodel: QuantizedModel, record: QdqRecord) -> np.dtype:
    dq = nodes_by_name(qmodel.model).get(record.dequantize_node)
    if dq is not None and len(dq.input) > 2 and dq.input[2]:
        values = proto_constant(qmodel.model, dq.input[2])
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
        self.model = copy_model(fp_model)
        self.qmodel = qmodel
        self.names = UniqueNames.of_model(self.model)
        self.fp_nodes = nodes_by_name(self.model)
        self.inits: list[onnx.TensorProto] = []
        self.outputs: dict[tuple[int, int], tuple[str, ...]] = {}
        self.float_outputs = float_tensors(self.model)
        self.q_nodes = nodes_by_name(qmodel.model)
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
    model = copy_model(fp_model)
    quant = copy_model(quant_model)
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
