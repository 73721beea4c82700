"""The only ModelProto <-> onnx-graphsurgeon boundary, constant values and dtypes as gs sees them, and the
same lookups on a ModelProto (for the graphs built node by node without gs)."""
from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from quantdbg.model.external import constant_array, tensor_array

FLOAT32 = np.dtype(np.float32)
"""The only float type quantized to INT8: activations and weights of other types stay as they are."""


def is_float(tensor: gs.Tensor) -> bool:
    """True for a float32 tensor, or one whose type is unknown."""
    dtype = tensor.dtype
    if dtype is None:
        return True
    # gs keeps dtypes NumPy lacks (bfloat16, float8) as onnx.TensorProto enums (ints).
    return not isinstance(dtype, int) and np.dtype(dtype) == FLOAT32


def constant_values(tensor: gs.Tensor) -> np.ndarray | None:
    """Values of an initializer or of a Constant node's output, else None.

    External weights are read from their data file each time, never cached in the graph.
    """
    if isinstance(tensor, gs.Constant):
        return constant_array(tensor)
    producer = tensor.inputs[0] if len(tensor.inputs) == 1 else None
    if producer is not None and producer.op == "Constant" \
            and isinstance(producer.attrs.get("value"), gs.Constant):
        return constant_array(producer.attrs["value"])
    return None


def copy_model(model: onnx.ModelProto) -> onnx.ModelProto:
    """An independent copy of ``model`` (its external weights stay references to their data file)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    return out


def nodes_by_name(model: onnx.ModelProto) -> dict[str, onnx.NodeProto]:
    """Node name -> node of ``model``'s main graph."""
    return {node.name: node for node in model.graph.node}


def constant_node_value(node: onnx.NodeProto) -> np.ndarray | None:
    """The values a Constant node holds in its ``value`` attribute, else None."""
    for attribute in node.attribute:
        if attribute.name == "value":
            return tensor_array(attribute.t)
    return None


def proto_constant(model: onnx.ModelProto, name: str) -> np.ndarray | None:
    """Values of an initializer or of a Constant node's output named ``name``, else None."""
    for init in model.graph.initializer:
        if init.name == name:
            return tensor_array(init)
    for node in model.graph.node:
        if node.op_type == "Constant" and node.output[0] == name:
            return constant_node_value(node)
    return None


def value_types(model: onnx.ModelProto) -> dict[str, int]:
    """Value name -> ONNX element type, from the model's value_info, inputs and outputs."""
    values = (*model.graph.value_info, *model.graph.input, *model.graph.output)
    return {v.name: v.type.tensor_type.elem_type for v in values}


def float_tensors(model: onnx.ModelProto) -> set[str]:
    """Names of the float32 values :func:`value_types` knows."""
    return {name for name, elem_type in value_types(model).items() if elem_type == onnx.TensorProto.FLOAT}


def trans_b(node: gs.Node | onnx.NodeProto | None) -> bool:
    """True for a Gemm that reads its B input transposed (``transB=1``: B is ``[N, K]``)."""
    if node is None:
        return False
    if isinstance(node, gs.Node):
        op, value = node.op, node.attrs.get("transB", 0)
    else:
        op = node.op_type
        value = next((onnx.helper.get_attribute_value(a) for a in node.attribute if a.name == "transB"), 0)
    return op == "Gemm" and bool(int(value))


def to_graph(model: onnx.ModelProto) -> gs.Graph:
    """Imports ``model`` into onnx-graphsurgeon (the copy is independent of ``model``)."""
    return gs.import_onnx(model)


def to_model(graph: gs.Graph, like: onnx.ModelProto | None = None) -> onnx.ModelProto:
    """Exports a graph, cleaned and topologically sorted, keeping the metadata of ``like``."""
    graph.cleanup(remove_unused_graph_inputs=False).toposort()
    kwargs = {}
    if like is not None:
        kwargs = {"producer_name": like.producer_name or "quantdbg", "ir_version": like.ir_version}
    model = gs.export_onnx(graph, do_type_check=False, **kwargs)
    if like is not None:
        del model.opset_import[:]
        model.opset_import.extend(like.opset_import)
        model.metadata_props.extend(like.metadata_props)
    return model
