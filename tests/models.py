"""Small models (<= 10 nodes) built in code with onnx-graphsurgeon, with seeded weights.

Every builder returns a fresh, checked ``onnx.ModelProto`` at opset 17 with a dynamic batch dim.
Area-specific builders live beside their tests (``models_<area>.py``) to keep this file stable.
"""
from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs

OPSET = 17


def _rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


def _const(name: str, shape: tuple[int, ...], rng: np.random.Generator, scale: float = 0.3) -> gs.Constant:
    return gs.Constant(name, (rng.standard_normal(shape) * scale).astype(np.float32))


def _finish(graph: gs.Graph) -> onnx.ModelProto:
    graph.cleanup().toposort()
    model = gs.export_onnx(graph)
    model.ir_version = 8
    del model.opset_import[:]
    model.opset_import.append(onnx.helper.make_opsetid("", OPSET))
    onnx.checker.check_model(model)
    return onnx.shape_inference.infer_shapes(model)


def conv_relu(seed: int = 0, channels: int = 4) -> onnx.ModelProto:
    """x[N,3,8,8] -> Conv(3->C, 3x3, pad 1) -> Relu -> y."""
    rng = _rng(seed)
    x = gs.Variable("x", np.float32, ("N", 3, 8, 8))
    conv_out = gs.Variable("conv_out", np.float32)
    y = gs.Variable("y", np.float32, ("N", channels, 8, 8))
    nodes = [
        gs.Node("Conv", "conv", {"pads": [1, 1, 1, 1]},
                inputs=[x, _const("conv.w", (channels, 3, 3, 3), rng), _const("conv.b", (channels,), rng)],
                outputs=[conv_out]),
        gs.Node("Relu", "relu", inputs=[conv_out], outputs=[y]),
    ]
    return _finish(gs.Graph(nodes, [x], [y], name="conv_relu"))


def conv_residual(seed: int = 0) -> onnx.ModelProto:
    """x[N,4,8,8] -> conv1 -> relu -> conv2 -> Add(conv2, x) -> relu -> y  (a ResNet block)."""
    rng = _rng(seed)
    x = gs.Variable("x", np.float32, ("N", 4, 8, 8))
    c1, r1, c2, s = (gs.Variable(n, np.float32) for n in ("c1", "r1", "c2", "sum"))
    y = gs.Variable("y", np.float32, ("N", 4, 8, 8))
    nodes = [
        gs.Node("Conv", "conv1", {"pads": [1, 1, 1, 1]}, inputs=[x, _const("conv1.w", (4, 4, 3, 3), rng)],
                outputs=[c1]),
        gs.Node("Relu", "relu1", inputs=[c1], outputs=[r1]),
        gs.Node("Conv", "conv2", {"pads": [1, 1, 1, 1]}, inputs=[r1, _const("conv2.w", (4, 4, 3, 3), rng)],
                outputs=[c2]),
        gs.Node("Add", "add", inputs=[c2, x], outputs=[s]),
        gs.Node("Relu", "relu2", inputs=[s], outputs=[y]),
    ]
    return _finish(gs.Graph(nodes, [x], [y], name="conv_residual"))


def concat_convs(seed: int = 0) -> onnx.ModelProto:
    """Two branches of different range concatenated, then a 1x1 conv: Concat inputs share a scale."""
    rng = _rng(seed)
    x = gs.Variable("x", np.float32, ("N", 3, 8, 8))
    a, b, bs, cat = (gs.Variable(n, np.float32) for n in ("a", "b", "b_scaled", "cat"))
    y = gs.Variable("y", np.float32, ("N", 2, 8, 8))
    nodes = [
        gs.Node("Conv", "conv_a", inputs=[x, _const("conv_a.w", (4, 3, 1, 1), rng)], outputs=[a]),
        gs.Node("Conv", "conv_b", inputs=[x, _const("conv_b.w", (4, 3, 1, 1), rng)], outputs=[b]),
        gs.Node("Mul", "scale_b", inputs=[b, gs.Constant("ten", np.array(10.0, np.float32))], outputs=[bs]),
        gs.Node("Concat", "concat", {"axis": 1}, inputs=[a, bs], outputs=[cat]),
        gs.Node("Conv", "conv_out", inputs=[cat, _const("conv_out.w", (2, 8, 1, 1), rng)], outputs=[y]),
    ]
    return _finish(gs.Graph(nodes, [x], [y], name="concat_convs"))


def mlp(seed: int = 0, hidden: int = 16) -> onnx.ModelProto:
    """x[N,8] -> Gemm(8->H) -> Relu -> MatMul(H->4) -> Add(bias) -> y: one Gemm and one MatMul."""
    rng = _rng(seed)
    x = gs.Variable("x", np.float32, ("N", 8))
    h, r, m = (gs.Variable(n, np.float32) for n in ("h", "r", "m"))
    y = gs.Variable("y", np.float32, ("N", 4))
    nodes = [
        gs.Node("Gemm", "fc1", {"transB": 1},
                inputs=[x, _const("fc1.w", (hidden, 8), rng), _const("fc1.b", (hidden,), rng)], outputs=[h]),
        gs.Node("Relu", "relu", inputs=[h], outputs=[r]),
        gs.Node("MatMul", "fc2", inputs=[r, _const("fc2.w", (hidden, 4), rng)], outputs=[m]),
        gs.Node("Add", "fc2_bias", inputs=[m, _const("fc2.b", (4,), rng)], outputs=[y]),
    ]
    return _finish(gs.Graph(nodes, [x], [y], name="mlp"))


def attention_matmuls(seed: int = 0, dim: int = 8) -> onnx.ModelProto:
    """x[N,T,D] -> q,k projections (MatMul with weights) -> q @ k^T (MatMul of two activations)."""
    rng = _rng(seed)
    x = gs.Variable("x", np.float32, ("N", 5, dim))
    q, k, kt = (gs.Variable(n, np.float32) for n in ("q", "k", "kt"))
    y = gs.Variable("y", np.float32, ("N", 5, 5))
    nodes = [
        gs.Node("MatMul", "q_proj", inputs=[x, _const("q.w", (dim, dim), rng)], outputs=[q]),
        gs.Node("MatMul", "k_proj", inputs=[x, _const("k.w", (dim, dim), rng)], outputs=[k]),
        gs.Node("Transpose", "k_t", {"perm": [0, 2, 1]}, inputs=[k], outputs=[kt]),
        gs.Node("MatMul", "scores", inputs=[q, kt], outputs=[y]),
    ]
    return _finish(gs.Graph(nodes, [x], [y], name="attention_matmuls"))


def log_matmul(seed: int = 0, width: int = 4) -> onnx.ModelProto:
    """x[N,W] -> Log -> l -> MatMul(W->W) -> y: finite inputs <= 0 give the activation ``l`` NaN/Inf."""
    x = gs.Variable("x", np.float32, ("N", width))
    log = gs.Variable("l", np.float32)
    y = gs.Variable("y", np.float32, ("N", width))
    nodes = [gs.Node("Log", "log", inputs=[x], outputs=[log]),
             gs.Node("MatMul", "fc", inputs=[log, _const("fc.w", (width, width), _rng(seed))], outputs=[y])]
    return _finish(gs.Graph(nodes, [x], [y], name="log_matmul"))
