"""Small models for weight discovery and feed fitting (<= 10 compute nodes), built in code.

``small_cnn`` and ``attention_block`` are clean exports (every weight an initializer); the tests put
them in the forms of :mod:`export_forms`. The other builders hold weights in the ways those forms do
not cover: one weight shared by two nodes, a weight behind a chain ONNX Runtime cannot evaluate, a
batch dimension fixed at 1, and a sequence model without a batch axis.
"""
from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs
from onnx import TensorProto, helper, numpy_helper

OPSET = 17


def _w(rng: np.random.Generator, name: str, shape: tuple[int, ...], scale: float = 0.3) -> gs.Constant:
    return gs.Constant(name, (rng.standard_normal(shape) * scale).astype(np.float32))


def _finish(graph: gs.Graph) -> onnx.ModelProto:
    graph.cleanup().toposort()
    model = gs.export_onnx(graph)
    model.ir_version = 8
    del model.opset_import[:]
    model.opset_import.append(helper.make_opsetid("", OPSET))
    onnx.checker.check_model(model)
    return onnx.shape_inference.infer_shapes(model)


def small_cnn(seed: int = 0, batch: int | str = "N") -> onnx.ModelProto:
    """x[B,3,8,8] -> conv1 -> relu -> conv2 -> Add(conv2, conv1) -> GlobalAveragePool -> Flatten ->
    fc (Gemm, transB) -> y[B,4]: Conv weights, a residual Add and a Gemm weight."""
    rng = np.random.default_rng(seed)
    x = gs.Variable("x", np.float32, (batch, 3, 8, 8))
    c1, r1, c2, s, p, f = (gs.Variable(n, np.float32) for n in ("c1", "r1", "c2", "sum", "pool", "flat"))
    y = gs.Variable("y", np.float32, (batch, 4))
    nodes = [
        gs.Node("Conv", "conv1", {"pads": [1, 1, 1, 1]}, inputs=[x, _w(rng, "conv1.w", (8, 3, 3, 3)),
                                                                 _w(rng, "conv1.b", (8,))], outputs=[c1]),
        gs.Node("Relu", "relu1", inputs=[c1], outputs=[r1]),
        gs.Node("Conv", "conv2", {"pads": [1, 1, 1, 1]}, inputs=[r1, _w(rng, "conv2.w", (8, 8, 3, 3))],
                outputs=[c2]),
        gs.Node("Add", "add", inputs=[c2, c1], outputs=[s]),
        gs.Node("GlobalAveragePool", "pool", inputs=[s], outputs=[p]),
        gs.Node("Flatten", "flatten", inputs=[p], outputs=[f]),
        gs.Node("Gemm", "fc", {"transB": 1}, inputs=[f, _w(rng, "fc.w", (4, 8)), _w(rng, "fc.b", (4,))],
                outputs=[y]),
    ]
    return _finish(gs.Graph(nodes, [x], [y], name="small_cnn"))


def attention_block(seed: int = 0, dim: int = 8, tokens: int = 5) -> onnx.ModelProto:
    """x[N,T,D] -> Q/K/V projections (MatMul) -> softmax(Q K^T) V -> output projection (MatMul) -> y."""
    rng = np.random.default_rng(seed)
    x = gs.Variable("x", np.float32, ("N", tokens, dim))
    q, k, v, kt, s, p, o = (gs.Variable(n, np.float32) for n in ("q", "k", "v", "kt", "scores", "probs", "o"))
    y = gs.Variable("y", np.float32, ("N", tokens, dim))
    nodes = [
        gs.Node("MatMul", "q_proj", inputs=[x, _w(rng, "q.w", (dim, dim))], outputs=[q]),
        gs.Node("MatMul", "k_proj", inputs=[x, _w(rng, "k.w", (dim, dim))], outputs=[k]),
        gs.Node("MatMul", "v_proj", inputs=[x, _w(rng, "v.w", (dim, dim))], outputs=[v]),
        gs.Node("Transpose", "k_t", {"perm": [0, 2, 1]}, inputs=[k], outputs=[kt]),
        gs.Node("MatMul", "qk", inputs=[q, kt], outputs=[s]),
        gs.Node("Softmax", "softmax", {"axis": -1}, inputs=[s], outputs=[p]),
        gs.Node("MatMul", "pv", inputs=[p, v], outputs=[o]),
        gs.Node("MatMul", "out_proj", inputs=[o, _w(rng, "out.w", (dim, dim))], outputs=[y]),
    ]
    return _finish(gs.Graph(nodes, [x], [y], name="attention_block"))


Shape = tuple[str | int, ...]


def _model(nodes: list[onnx.NodeProto], x: Shape, y: Shape) -> onnx.ModelProto:
    """A checked, shape-inferred model of ``nodes`` from float input ``x`` to float output ``y``."""
    value = helper.make_tensor_value_info
    graph = helper.make_graph(nodes, "model", [value("x", TensorProto.FLOAT, list(x))],
                              [value("y", TensorProto.FLOAT, list(y))])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return onnx.shape_inference.infer_shapes(model)


def _constant(name: str, value: np.ndarray) -> onnx.NodeProto:
    return helper.make_node("Constant", [], [name], name=f"{name}/Constant",
                            value=numpy_helper.from_array(value, name))


def shared_constant_weight(seed: int = 0) -> onnx.ModelProto:
    """One weight in a Constant node read by two MatMuls (tied projections): x -> a, x -> b, y = a + b."""
    w = (np.random.default_rng(seed).standard_normal((6, 6)) * 0.3).astype(np.float32)
    nodes = [_constant("w", w),
             helper.make_node("MatMul", ["x", "w"], ["a"], name="proj_a"),
             helper.make_node("Relu", ["x"], ["rx"], name="relu"),
             helper.make_node("MatMul", ["rx", "w"], ["b"], name="proj_b"),
             helper.make_node("Add", ["a", "b"], ["y"], name="add")]
    return _model(nodes, ("N", 6), ("N", 6))


def weight_behind_custom_op(seed: int = 0) -> onnx.ModelProto:
    """A MatMul weight computed from an initializer by an op of a custom domain ONNX Runtime lacks."""
    w = (np.random.default_rng(seed).standard_normal((6, 6)) * 0.3).astype(np.float32)
    nodes = [helper.make_node("Rescale", ["w.stored"], ["w"], name="w/Rescale", domain="com.example"),
             helper.make_node("MatMul", ["x", "w"], ["y"], name="proj")]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 6])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 6])
    graph = helper.make_graph(nodes, "model", [x], [y], [numpy_helper.from_array(w, "w.stored")],
                              value_info=[helper.make_tensor_value_info("w", TensorProto.FLOAT, [6, 6])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET),
                                                    helper.make_opsetid("com.example", 1)])
    model.ir_version = 8
    return model


def reshape_with_constant_shape(seed: int = 0) -> onnx.ModelProto:
    """x[N,12] -> MatMul(weight in a Constant node) -> Reshape(shape from a Constant node) -> y[N,2,3]."""
    w = (np.random.default_rng(seed).standard_normal((12, 6)) * 0.3).astype(np.float32)
    nodes = [_constant("w", w),
             _constant("shape", np.array([-1, 2, 3], np.int64)),
             helper.make_node("MatMul", ["x", "w"], ["m"], name="proj"),
             helper.make_node("Reshape", ["m", "shape"], ["y"], name="reshape")]
    return _model(nodes, ("N", 12), ("N", 2, 3))


def sequence_model(seed: int = 0, features: int = 6) -> onnx.ModelProto:
    """A model without a batch axis: x[seq, F] -> MatMul -> Relu -> MatMul -> y[seq, F] (a sequence
    of token features, as some recognizers export)."""
    rng = np.random.default_rng(seed)
    x = gs.Variable("x", np.float32, ("sequence_length", features))
    h, r = gs.Variable("h", np.float32), gs.Variable("r", np.float32)
    y = gs.Variable("y", np.float32, ("sequence_length", features))
    nodes = [gs.Node("MatMul", "fc1", inputs=[x, _w(rng, "fc1.w", (features, 8))], outputs=[h]),
             gs.Node("Relu", "relu", inputs=[h], outputs=[r]),
             gs.Node("MatMul", "fc2", inputs=[r, _w(rng, "fc2.w", (8, features))], outputs=[y])]
    return _finish(gs.Graph(nodes, [x], [y], name="sequence_model"))


def stateful_sequence_model(seed: int = 0, features: int = 6) -> onnx.ModelProto:
    """A sequence model with a state input, as voice-activity detectors export: x[seq, F] and
    state[1, 1, F] (axis 0 fixed at 1 but not a batch) -> MatMul(x + state) -> y[seq, F]."""
    rng = np.random.default_rng(seed)
    x = gs.Variable("x", np.float32, ("sequence_length", features))
    state = gs.Variable("state", np.float32, (1, 1, features))
    s2, a = gs.Variable("s2", np.float32), gs.Variable("a", np.float32)
    y = gs.Variable("y", np.float32, ("sequence_length", features))
    to_2d = gs.Constant("to_2d", np.array([1, features], np.int64))
    nodes = [gs.Node("Reshape", "flatten_state", inputs=[state, to_2d], outputs=[s2]),
             gs.Node("Add", "add_state", inputs=[x, s2], outputs=[a]),
             gs.Node("MatMul", "fc", inputs=[a, _w(rng, "fc.w", (features, features))], outputs=[y])]
    return _finish(gs.Graph(nodes, [x, state], [y], name="stateful_sequence_model"))
