"""Extra small models for the Q/DQ placement tests (built in code with onnx-graphsurgeon)."""
from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs
from models import _const, _finish, _rng, mlp


def deconv_gemm(seed: int = 0) -> onnx.ModelProto:
    """x[N,2,4,4] -> ConvTranspose(2->3, stride 2) -> Flatten -> Gemm(transB=0) -> y."""
    rng = _rng(seed)
    x = gs.Variable("x", np.float32, ("N", 2, 4, 4))
    d, f = (gs.Variable(n, np.float32) for n in ("d", "f"))
    y = gs.Variable("y", np.float32, ("N", 5))
    nodes = [
        gs.Node("ConvTranspose", "deconv", {"strides": [2, 2], "kernel_shape": [2, 2]},
                inputs=[x, _const("deconv.w", (2, 3, 2, 2), rng), _const("deconv.b", (3,), rng)],
                outputs=[d]),
        gs.Node("Flatten", "flat", {"axis": 1}, inputs=[d], outputs=[f]),
        gs.Node("Gemm", "fc", {"transB": 0}, inputs=[f, _const("fc.w", (3 * 8 * 8, 5), rng, 0.05)],
                outputs=[y]),
    ]
    return _finish(gs.Graph(nodes, [x], [y], name="deconv_gemm"))


def projection_residual(seed: int = 0) -> onnx.ModelProto:
    """Two Convs added (a ResNet downsampling block): only one Add input gets Q/DQ."""
    rng = _rng(seed)
    x = gs.Variable("x", np.float32, ("N", 3, 8, 8))
    a, b, s = (gs.Variable(n, np.float32) for n in ("main", "shortcut", "sum"))
    y = gs.Variable("y", np.float32, ("N", 4, 8, 8))
    nodes = [
        gs.Node("Conv", "conv_main", {"pads": [1, 1, 1, 1]}, inputs=[x, _const("main.w", (4, 3, 3, 3), rng)],
                outputs=[a]),
        gs.Node("Conv", "conv_proj", inputs=[x, _const("proj.w", (4, 3, 1, 1), rng)], outputs=[b]),
        gs.Node("Add", "add", inputs=[a, b], outputs=[s]),
        gs.Node("Relu", "relu", inputs=[s], outputs=[y]),
    ]
    return _finish(gs.Graph(nodes, [x], [y], name="projection_residual"))


def nested_concat(seed: int = 0) -> onnx.ModelProto:
    """Concat(Concat(a, b), c) -> Conv: all five tensors share one scale."""
    rng = _rng(seed)
    x = gs.Variable("x", np.float32, ("N", 2, 4, 4))
    a, b, c, ab, abc = (gs.Variable(n, np.float32) for n in ("a", "b", "c", "ab", "abc"))
    y = gs.Variable("y", np.float32, ("N", 2, 4, 4))
    nodes = [
        gs.Node("Relu", "relu", inputs=[x], outputs=[a]),
        gs.Node("Sigmoid", "sig", inputs=[x], outputs=[b]),
        gs.Node("Mul", "triple", inputs=[x, gs.Constant("three", np.array(3.0, np.float32))], outputs=[c]),
        gs.Node("Concat", "cat_inner", {"axis": 1}, inputs=[a, b], outputs=[ab]),
        gs.Node("Concat", "cat_outer", {"axis": 1}, inputs=[ab, c], outputs=[abc]),
        gs.Node("Conv", "conv", inputs=[abc, _const("conv.w", (2, 6, 1, 1), rng)], outputs=[y]),
    ]
    return _finish(gs.Graph(nodes, [x], [y], name="nested_concat"))


def conv_dead_channel(seed: int = 0) -> onnx.ModelProto:
    """conv_relu with output channel 1's weights all zero (a pruned filter)."""
    rng = _rng(seed)
    weights = (rng.standard_normal((3, 3, 3, 3)) * 0.3).astype(np.float32)
    weights[1] = 0.0
    x = gs.Variable("x", np.float32, ("N", 3, 8, 8))
    y = gs.Variable("y", np.float32, ("N", 3, 8, 8))
    node = gs.Node("Conv", "conv", {"pads": [1, 1, 1, 1]}, inputs=[x, gs.Constant("conv.w", weights)],
                   outputs=[y])
    return _finish(gs.Graph([node], [x], [y], name="conv_dead_channel"))


def unnamed_nodes(seed: int = 0) -> onnx.ModelProto:
    """An MLP whose nodes have no names (as some exporters write them)."""
    model = mlp(seed)
    for node in model.graph.node:
        node.name = ""
    return model
