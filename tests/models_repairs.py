"""Small models for bias correction and cross-layer equalization, each with the weights it is built from.

The equalization models chain Conv/Gemm layers through Relu, LeakyRelu or nothing, depthwise Convs
included; their channel ranges differ on purpose, so scales are far from 1 and a wrongly placed one
shows in the outputs. The bias-correction models hold weights a fixed fraction of a step away from
the INT8 grid, so rounding shifts every channel the same way and the shift is known exactly.
"""
from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs
from models import _finish

from quantdbg.quant_math import QMAX


def _w(rng: np.random.Generator, shape: tuple[int, ...], scale: float = 0.5) -> np.ndarray:
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def chain_weights(seed: int = 0, spread: float = 1.0) -> dict[str, np.ndarray]:
    """Weights of :func:`conv_chain`; ``spread`` (in decades) makes conv1's output channels unbalanced."""
    rng = np.random.default_rng(seed)
    gains = (10.0 ** np.linspace(-spread, 0, 6)).astype(np.float32)
    w1 = _w(rng, (6, 3, 3, 3)) * gains[:, None, None, None]
    w3 = _w(rng, (8, 6, 1, 1)) / gains[None, :, None, None]  # the small channels matter downstream
    return {"c1.w": w1, "c1.b": _w(rng, (6,), 0.1) * gains, "dw.w": _w(rng, (6, 1, 3, 3)),
            "dw.b": _w(rng, (6,), 0.1), "c3.w": w3, "c3.b": _w(rng, (8,), 0.1), "c4.w": _w(rng, (4, 8, 1, 1)),
            "fc1.w": _w(rng, (16, 10)), "fc1.b": _w(rng, (10,), 0.1), "fc2.w": _w(rng, (5, 10)),
            "fc2.b": _w(rng, (5,), 0.1)}


def conv_chain(seed: int = 0, spread: float = 1.0) -> onnx.ModelProto:
    """x[N,3,8,8] -> c1 -> Relu -> depthwise dw -> Relu -> c3 (1x1) -> LeakyRelu -> MaxPool -> c4 (1x1, no
    bias) -> y[N,4,4,4];
    and z[N,16] -> fc1 (Gemm) -> Relu -> fc2 (Gemm, transB) -> v. Pairs: (c1, dw), (dw, c3), (c3, c4),
    (fc1, fc2)."""
    w = {name: gs.Constant(name, value) for name, value in chain_weights(seed, spread).items()}
    x, z = gs.Variable("x", np.float32, ("N", 3, 8, 8)), gs.Variable("z", np.float32, ("N", 16))
    t = [gs.Variable(f"t{i}", np.float32) for i in range(9)]
    y, v = gs.Variable("y", np.float32, ("N", 4, 4, 4)), gs.Variable("v", np.float32, ("N", 5))
    nodes = [
        gs.Node("Conv", "c1", {"pads": [1, 1, 1, 1]}, inputs=[x, w["c1.w"], w["c1.b"]], outputs=[t[0]]),
        gs.Node("Relu", "r1", inputs=[t[0]], outputs=[t[1]]),
        gs.Node("Conv", "dw", {"pads": [1, 1, 1, 1], "group": 6}, inputs=[t[1], w["dw.w"], w["dw.b"]],
                outputs=[t[2]]),
        gs.Node("Relu", "r2", inputs=[t[2]], outputs=[t[3]]),
        gs.Node("Conv", "c3", inputs=[t[3], w["c3.w"], w["c3.b"]], outputs=[t[4]]),
        gs.Node("LeakyRelu", "r3", {"alpha": 0.1}, inputs=[t[4]], outputs=[t[5]]),
        gs.Node("MaxPool", "pool", {"kernel_shape": [2, 2], "strides": [2, 2]}, inputs=[t[5]],
                outputs=[t[8]]),
        gs.Node("Conv", "c4", inputs=[t[8], w["c4.w"]], outputs=[y]),
        gs.Node("Gemm", "fc1", inputs=[z, w["fc1.w"], w["fc1.b"]], outputs=[t[6]]),
        gs.Node("Relu", "r4", inputs=[t[6]], outputs=[t[7]]),
        gs.Node("Gemm", "fc2", {"transB": 1}, inputs=[t[7], w["fc2.w"], w["fc2.b"]], outputs=[v]),
    ]
    return _finish(gs.Graph(nodes, [x, z], [y, v], name="conv_chain"))


def clipped_pair(seed: int = 0) -> onnx.ModelProto:
    """x[N,3,8,8] -> a -> Clip(0, 6) -> b -> y, and a's output also read by a second reader -> u: no pair
    is equalizable (bounded activation; a tensor with two readers)."""
    rng = np.random.default_rng(seed)
    x = gs.Variable("x", np.float32, ("N", 3, 8, 8))
    t0, t1 = gs.Variable("t0", np.float32), gs.Variable("t1", np.float32)
    y, u = gs.Variable("y", np.float32, ("N", 4, 8, 8)), gs.Variable("u", np.float32, ("N", 4, 8, 8))
    lo, hi = gs.Constant("lo", np.array(0.0, np.float32)), gs.Constant("hi", np.array(6.0, np.float32))
    nodes = [
        gs.Node("Conv", "a", {"pads": [1, 1, 1, 1]}, inputs=[x, gs.Constant("a.w", _w(rng, (4, 3, 3, 3)))],
                outputs=[t0]),
        gs.Node("Clip", "clip", inputs=[t0, lo, hi], outputs=[t1]),
        gs.Node("Conv", "b", inputs=[t1, gs.Constant("b.w", _w(rng, (4, 4, 1, 1)))], outputs=[y]),
        gs.Node("Conv", "c", inputs=[t0, gs.Constant("c.w", _w(rng, (4, 4, 1, 1)))], outputs=[u]),
    ]
    return _finish(gs.Graph(nodes, [x], [y, u], name="clipped_pair"))


def relu6_chain(seed: int = 0) -> onnx.ModelProto:
    """x[N,3,8,8] -> a -> Clip(0, 6) -> b -> Clip(-1, 6) -> c -> y: the ReLU6 is crossed (its ceiling rescaled
    per channel), the Clip with a non-zero floor is not. a's channels are unbalanced and large enough that
    the ceiling clips."""
    rng = np.random.default_rng(seed)
    gains = (10.0 ** np.linspace(-1.5, 0.5, 5)).astype(np.float32)
    x = gs.Variable("x", np.float32, ("N", 3, 8, 8))
    t = [gs.Variable(f"t{i}", np.float32) for i in range(4)]
    y = gs.Variable("y", np.float32, ("N", 4, 8, 8))
    zero, six = gs.Constant("zero", np.array(0.0, np.float32)), gs.Constant("six", np.array(6.0, np.float32))
    minus_one = gs.Constant("minus_one", np.array(-1.0, np.float32))
    nodes = [
        gs.Node("Conv", "a", {"pads": [1, 1, 1, 1]},
                inputs=[x, gs.Constant("a.w", _w(rng, (5, 3, 3, 3), 2.0) * gains[:, None, None, None]),
                        gs.Constant("a.b", _w(rng, (5,), 0.5))], outputs=[t[0]]),
        gs.Node("Clip", "relu6", inputs=[t[0], zero, six], outputs=[t[1]]),
        gs.Node("Conv", "b", inputs=[t[1], gs.Constant("b.w", _w(rng, (6, 5, 1, 1)))], outputs=[t[2]]),
        gs.Node("Clip", "clip", inputs=[t[2], minus_one, six], outputs=[t[3]]),
        gs.Node("Conv", "c", inputs=[t[3], gs.Constant("c.w", _w(rng, (4, 6, 1, 1)))], outputs=[y]),
    ]
    return _finish(gs.Graph(nodes, [x], [y], name="relu6_chain"))


def off_grid(values: np.ndarray, frac: float = 0.4) -> np.ndarray:
    """``values`` moved to ``k + frac`` INT8 steps of their per-output-channel scale (axis 0), so that
    round-to-nearest moves every weight of a channel by ``-frac`` steps (``frac`` < 0.5): a planted,
    systematic rounding shift. Each channel's largest |w| stays on the grid (it sets the scale)."""
    w = np.asarray(values, np.float64)
    flat = w.reshape(w.shape[0], -1)
    amax = np.abs(flat).max(axis=1, keepdims=True)
    step = amax / QMAX
    k = np.clip(np.floor(flat / step), -QMAX, QMAX - 1)
    moved = (k + frac) * step
    peak = np.abs(flat).argmax(axis=1)
    moved[np.arange(len(flat)), peak] = amax[:, 0]  # keep the scale
    return moved.reshape(w.shape).astype(np.float32)


def shifted_weights(seed: int = 0) -> dict[str, np.ndarray]:
    """Weights of :func:`shifted_layers`, each off the grid by 0.4 step."""
    rng = np.random.default_rng(seed)
    return {"conv.w": off_grid(_w(rng, (5, 3, 3, 3))), "conv.b": _w(rng, (5,), 0.1),
            "nob.w": off_grid(_w(rng, (4, 5, 1, 1))),
            "fc.w": off_grid(_w(rng, (6, 12))), "fc.b": _w(rng, (6,), 0.1),
            "mm.w": off_grid(_w(rng, (12, 6))).T.copy(), "mm.b": _w(rng, (12,), 0.1),  # [K, N]: channels last
            "bare.w": off_grid(_w(rng, (3, 12))).T.copy()}


def shifted_layers(seed: int = 0) -> onnx.ModelProto:
    """x[N,3,6,6] -> conv (bias) -> nob (1x1, no bias) -> y; z[N,12] -> fc (Gemm, transB, bias) ->
    mm (MatMul + Add bias) -> h -> bare (MatMul, no bias Add) -> v.

    Every weight sits 0.4 INT8 step above a grid point, so INT8 rounding shifts each output channel by
    ``-0.4 step * sum of its inputs``: non-zero whenever the inputs have a non-zero mean."""
    w = {name: gs.Constant(name, value) for name, value in shifted_weights(seed).items()}
    x, z = gs.Variable("x", np.float32, ("N", 3, 6, 6)), gs.Variable("z", np.float32, ("N", 12))
    t0, f, m, h = (gs.Variable(n, np.float32) for n in ("t0", "f", "m", "h"))
    y, v = gs.Variable("y", np.float32, ("N", 4, 6, 6)), gs.Variable("v", np.float32, ("N", 3))
    nodes = [
        gs.Node("Conv", "conv", {"pads": [1, 1, 1, 1]}, inputs=[x, w["conv.w"], w["conv.b"]], outputs=[t0]),
        gs.Node("Conv", "nob", inputs=[t0, w["nob.w"]], outputs=[y]),
        gs.Node("Gemm", "fc", {"transB": 1}, inputs=[z, w["fc.w"], w["fc.b"]], outputs=[f]),
        gs.Node("MatMul", "mm", inputs=[f, w["mm.w"]], outputs=[m]),
        gs.Node("Add", "mm_bias", inputs=[m, w["mm.b"]], outputs=[h]),
        gs.Node("MatMul", "bare", inputs=[h, w["bare.w"]], outputs=[v]),
    ]
    return _finish(gs.Graph(nodes, [x, z], [y, v], name="shifted_layers"))
