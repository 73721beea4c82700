"""The same model in the forms real exporters write its weights in (tests and benchmarks share these).

A clean PyTorch export keeps every weight in an initializer. Other exporters do not:

* ``constants``: every initializer moved into a ``Constant`` node (Paddle, some opset-12 exports);
* ``transposed``: MatMul/Gemm weights stored transposed, read through a ``Transpose`` node
  (tf2onnx, Keras, tied embeddings);
* ``fp16``: float initializers stored as float16 and read through ``Cast(to=float)`` (half-precision
  exports);
* ``inputs``: every initializer also listed as a graph input (IR < 4, ``keep_initializers_as_inputs``).

Each function returns a new model computing exactly what the original computes (for ``fp16``:
when the weights are representable in float16, which the test models make sure of).
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

FORMS = ("initializers", "constants", "transposed", "fp16", "inputs")


def _copy(model: onnx.ModelProto) -> onnx.ModelProto:
    out = onnx.ModelProto()
    out.CopyFrom(model)
    return out


def _prepend(model: onnx.ModelProto, nodes: list[onnx.NodeProto]) -> None:
    kept = list(model.graph.node)
    del model.graph.node[:]
    model.graph.node.extend(nodes + kept)


def constants(model: onnx.ModelProto) -> onnx.ModelProto:
    """Every initializer becomes the output of a Constant node of the same name."""
    out = _copy(model)
    nodes = [helper.make_node("Constant", [], [init.name], name=f"{init.name}/Constant", value=init)
             for init in out.graph.initializer]
    del out.graph.initializer[:]
    _prepend(out, nodes)
    return out


def _weighted_inputs(model: onnx.ModelProto) -> list[tuple[onnx.NodeProto, str]]:
    inits = {i.name for i in model.graph.initializer}
    return [(node, node.input[1]) for node in model.graph.node
            if node.op_type in ("MatMul", "Gemm") and len(node.input) > 1 and node.input[1] in inits]


def transposed(model: onnx.ModelProto) -> onnx.ModelProto:
    """MatMul/Gemm weights stored transposed (last two axes) and read through a Transpose node."""
    out = _copy(model)
    inits = {i.name: i for i in out.graph.initializer}
    nodes = []
    for node, name in _weighted_inputs(out):
        values = numpy_helper.to_array(inits[name])
        perm = list(range(values.ndim - 2)) + [values.ndim - 1, values.ndim - 2]
        stored = f"{name}/stored_transposed"
        if stored not in inits:
            inits[stored] = numpy_helper.from_array(np.ascontiguousarray(values.transpose(perm)), stored)
            out.graph.initializer.append(inits[stored])
            nodes.append(helper.make_node("Transpose", [stored], [f"{name}/transposed"],
                                          name=f"{name}/Transpose", perm=perm))
        node.input[1] = f"{name}/transposed"
    _prepend(out, nodes)
    used = {i for n in out.graph.node for i in n.input}
    kept = [i for i in out.graph.initializer if i.name in used]
    del out.graph.initializer[:]
    out.graph.initializer.extend(kept)
    return out


def fp16(model: onnx.ModelProto) -> onnx.ModelProto:
    """Float initializers of 2+ dims stored as float16 under another name, read through Cast(to=float)."""
    out = _copy(model)
    nodes, kept = [], []
    for init in out.graph.initializer:
        values = numpy_helper.to_array(init)
        if values.dtype != np.float32 or values.ndim < 2:
            kept.append(init)
            continue
        half = f"{init.name}/fp16"
        kept.append(numpy_helper.from_array(values.astype(np.float16), half))
        nodes.append(helper.make_node("Cast", [half], [init.name], name=f"{init.name}/Cast",
                                      to=onnx.TensorProto.FLOAT))
    del out.graph.initializer[:]
    out.graph.initializer.extend(kept)
    _prepend(out, nodes)
    return out


def inputs(model: onnx.ModelProto) -> onnx.ModelProto:
    """Every initializer also declared as a graph input (what IR 3 required)."""
    out = _copy(model)
    declared = {i.name for i in out.graph.input}
    out.graph.input.extend(helper.make_tensor_value_info(init.name, init.data_type, list(init.dims))
                           for init in out.graph.initializer if init.name not in declared)
    return out


def form(model: onnx.ModelProto, name: str) -> onnx.ModelProto:
    """``model`` in the named form (``"initializers"``: an unchanged copy)."""
    builders = {"initializers": _copy, "constants": constants, "transposed": transposed, "fp16": fp16,
                "inputs": inputs}
    return builders[name](model)


def fp16_exact(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy whose float initializers are rounded to float16 values, so the ``fp16`` form is exact."""
    out = _copy(model)
    for init in out.graph.initializer:
        values = numpy_helper.to_array(init)
        if values.dtype == np.float32:
            init.CopyFrom(numpy_helper.from_array(values.astype(np.float16).astype(np.float32), init.name))
    return out
