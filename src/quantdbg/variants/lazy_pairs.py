"""Weight Q/DQ pairs left to ONNX Runtime when the weight stays in its data file.

Folding ``DQ(Q(w))`` in NumPy reads the weight into memory and holds its fake-quantized copy in
the graph, and ONNX Runtime then holds it again. For a weight left in its data file (a large
model loaded lazily) the sensitivity graphs keep the pair instead, computed by ONNX Runtime with
the kernels a run would use, so the values are the same and only the session holds them: the
local graph's clones read it folded at session creation (a constant, as the NumPy form is); the
switchable graph's If branch folds only ``Q(w)``, to INT8, and dequantizes it when the branch runs
(:func:`dequantize_per_run`), so that session holds the weight once in FP32 and once in INT8.
"""
from __future__ import annotations

from collections.abc import Mapping

import onnx

from quantdbg.model.external import is_external
from quantdbg.model.graph import nodes_by_name
from quantdbg.model.names import UniqueNames
from quantdbg.qdq import QdqRecord


def lazy_pair(model: onnx.ModelProto, record: QdqRecord, nodes: Mapping[str, onnx.NodeProto]) -> bool:
    """True when the record's Q reads a weight left in its data file and its Q and DQ otherwise
    read only initializers (scales, zero points): a pair ONNX Runtime folds."""
    q = nodes.get(record.quantize_node) if record.quantize_node else None
    dq = nodes.get(record.dequantize_node)
    if q is None or dq is None or dq.input[0] != q.output[0]:
        return False
    inits = {init.name: init for init in model.graph.initializer}
    weight = inits.get(q.input[0])
    return weight is not None and is_external(weight) \
        and all(name in inits for name in (*q.input[1:], *dq.input[1:]) if name)


def copy_pair(model: onnx.ModelProto, record: QdqRecord, names: UniqueNames, nodes: list[onnx.NodeProto],
              inits: list[onnx.TensorProto]) -> str:
    """Copies a :func:`lazy_pair` of ``model`` into another graph; returns its DQ's output.

    The pair's nodes are appended to ``nodes`` and its initializers, renamed, to ``inits``: the
    weight as a reference to its data file (no data is read), the scales and zero points.
    """
    q_nodes = nodes_by_name(model)
    q, dq = onnx.NodeProto(), onnx.NodeProto()
    q.CopyFrom(q_nodes[record.quantize_node])
    dq.CopyFrom(q_nodes[record.dequantize_node])
    sources = {init.name: init for init in model.graph.initializer}
    base = f"{record.node}/input{record.input_index}/fake_quantized"
    renamed: dict[str, str] = {}
    for node in (q, dq):
        for i, name in enumerate(node.input):
            if name in sources and name not in renamed:
                renamed[name] = _copy_init(sources[name], names(f"{base}/{name}"), inits)
            node.input[i] = renamed.get(name, name)
    q.name, dq.name = names(f"{base}/QuantizeLinear"), names(f"{base}/DequantizeLinear")
    q.output[0] = dq.input[0] = names(f"{base}/quantized")
    dq.output[0] = names(base)
    nodes += [q, dq]
    return dq.output[0]


def dequantize_per_run(dq: onnx.NodeProto, switch: str,
                       names: UniqueNames) -> tuple[onnx.NodeProto, onnx.NodeProto]:
    """A copy of a :func:`lazy_pair`'s DequantizeLinear that ONNX Runtime dequantizes at each run.

    ONNX Runtime's constant folding (with its QDQ fusions off, as quantdbg runs it) would fold the
    pair into an FP32 copy of the weight, held beside the FP32 weight the switched-off branch
    reads. The copy reads its scale through ``Where(switch, scale, scale)`` instead: the scale
    itself, bit for bit, whatever the switch, but no constant, so only ``Q(w)`` is folded (to an
    INT8 constant, a quarter of the weight) and the branch dequantizes it when it runs, with the
    same kernel that would have folded it (the values are the same).

    Args:
        dq: The pair's DequantizeLinear (not modified).
        switch: The name of the layer's boolean switch input.
        names: Fresh names for the graph.

    Returns:
        The ``Where`` node (it must precede the branch) and the DequantizeLinear copy reading it.
    """
    scale = names(f"{dq.input[1]}/per_run")
    where = onnx.helper.make_node("Where", [switch, dq.input[1], dq.input[1]], [scale],
                                  name=names(f"{dq.name}/per_run_scale"))
    copy = onnx.NodeProto()
    copy.CopyFrom(dq)
    copy.input[1] = scale
    return where, copy


def _copy_init(init: onnx.TensorProto, name: str, inits: list[onnx.TensorProto]) -> str:
    copy = onnx.TensorProto()
    copy.CopyFrom(init)  # an external tensor copies its reference to the data file, not its data
    copy.name = name
    inits.append(copy)
    return name


__all__ = ["copy_pair", "dequantize_per_run", "lazy_pair"]
