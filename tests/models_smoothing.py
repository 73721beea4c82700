"""Small models for the smoothing tests, each with a NumPy forward pass as the oracle.

Channel ranges differ on purpose (one input channel carries an outlier), so smoothing factors
are far from 1 and a wrongly placed ``s`` would show in the outputs.
"""
from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs
from models import OPSET

EPS = 1e-5


def _finish(graph: gs.Graph) -> onnx.ModelProto:
    graph.cleanup().toposort()
    model = gs.export_onnx(graph)
    model.ir_version = 8
    del model.opset_import[:]
    model.opset_import.append(onnx.helper.make_opsetid("", OPSET))
    onnx.checker.check_model(model)
    return onnx.shape_inference.infer_shapes(model)


def _w(rng: np.random.Generator, shape: tuple[int, ...], scale: float = 0.5) -> np.ndarray:
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def ln_ffn_weights(seed: int = 0) -> dict[str, np.ndarray]:
    """The initializers of :func:`ln_ffn`, by name."""
    rng = np.random.default_rng(seed)
    gamma = (1.0 + rng.standard_normal(8) * 0.2).astype(np.float32)
    gamma[3] = 12.0  # an outlier channel in the LayerNorm output
    return {"ln.gamma": gamma, "ln.beta": _w(rng, (8,), 0.3), "wq": _w(rng, (8, 6)), "wk": _w(rng, (8, 6)),
            "wup": _w(rng, (8, 16)), "bup": _w(rng, (16,), 0.3), "half": np.array(0.5, np.float32),
            "wd": _w(rng, (16, 8))}


def ln_ffn(seed: int = 0) -> onnx.ModelProto:
    """x[N,T,8] -> LayerNorm -> {q, k, up} MatMuls; up+bias -> Mul 0.5 -> down MatMul; q @ k^T.

    Every reader of the LayerNorm output is a smoothed MatMul (plus a Shape), so ``1/s`` folds
    into gamma/beta; the down projection's input comes from a Mul by a constant, which absorbs
    ``1/s``; ``q @ k^T`` has no initializer weight and is skipped.
    """
    w = {name: gs.Constant(name, value) for name, value in ln_ffn_weights(seed).items()}
    x = gs.Variable("x", np.float32, ("N", 5, 8))
    ln, up, h, g, kt = (gs.Variable(n, np.float32) for n in ("ln", "up", "h", "g", "kt"))
    q, k = gs.Variable("q", np.float32), gs.Variable("k", np.float32)
    d, att = gs.Variable("d", np.float32, ("N", 5, 8)), gs.Variable("att", np.float32, ("N", 5, 5))
    shape = gs.Variable("ln_shape", np.int64, (3,))
    nodes = [
        gs.Node("LayerNormalization", "ln", {"axis": -1, "epsilon": EPS},
                inputs=[x, w["ln.gamma"], w["ln.beta"]], outputs=[ln]),
        gs.Node("Shape", "shape", inputs=[ln], outputs=[shape]),
        gs.Node("MatMul", "q", inputs=[ln, w["wq"]], outputs=[q]),
        gs.Node("MatMul", "k", inputs=[ln, w["wk"]], outputs=[k]),
        gs.Node("MatMul", "up", inputs=[ln, w["wup"]], outputs=[up]),
        gs.Node("Add", "up_bias", inputs=[w["bup"], up], outputs=[h]),
        gs.Node("Mul", "half", inputs=[h, w["half"]], outputs=[g]),
        gs.Node("MatMul", "down", inputs=[g, w["wd"]], outputs=[d]),
        gs.Node("Transpose", "kt", {"perm": [0, 2, 1]}, inputs=[k], outputs=[kt]),
        gs.Node("MatMul", "att", inputs=[q, kt], outputs=[att]),
    ]
    return _finish(gs.Graph(nodes, [x], [d, att, shape], name="ln_ffn"))


def layernorm(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray) -> np.ndarray:
    """NumPy LayerNormalization over the last axis."""
    x64 = x.astype(np.float64)
    mean = x64.mean(axis=-1, keepdims=True)
    var = ((x64 - mean) ** 2).mean(axis=-1, keepdims=True)
    return (x64 - mean) / np.sqrt(var + EPS) * gamma + beta


def ln_ffn_forward(x: np.ndarray, seed: int = 0) -> dict[str, np.ndarray]:
    """NumPy forward of :func:`ln_ffn`: every intermediate tensor by name (float64)."""
    w = {k: v.astype(np.float64) for k, v in ln_ffn_weights(seed).items()}
    ln = layernorm(x, w["ln.gamma"], w["ln.beta"])
    q, k = ln @ w["wq"], ln @ w["wk"]
    g = (ln @ w["wup"] + w["bup"]) * w["half"]
    return {"ln": ln, "g": g, "d": g @ w["wd"], "att": q @ np.swapaxes(k, 1, 2)}


def residual_gemm_weights(seed: int = 1) -> dict[str, np.ndarray]:
    """The initializers of :func:`residual_gemm`, by name."""
    rng = np.random.default_rng(seed)
    w1 = _w(rng, (8, 8))
    w1[:, 2] *= 20.0  # an outlier channel in the MatMul+bias output
    wx = _w(rng, (8, 4))
    wx[:, 1] *= 15.0
    return {"ln.gamma": (1.0 + _w(rng, (8,), 0.2)), "ln.beta": _w(rng, (8,), 0.3), "w1": w1,
            "b1": _w(rng, (8,), 0.3), "w2": _w(rng, (8, 8)), "gb": _w(rng, (5, 8)), "gc": _w(rng, (5,)),
            "wx": wx, "wt": _w(rng, (4, 4))}


def residual_gemm(seed: int = 1) -> onnx.ModelProto:
    """x[N,8] -> LayerNorm -> MatMul+bias -> MatMul -> residual Add -> Gemm(transB); x -> MatMul -> MatMul.

    The LayerNorm output also feeds the residual Add and the graph input also feeds the
    LayerNorm, so both get an explicit Mul; ``a = MatMul+bias`` folds into ``w1``/``b1``;
    ``z = x @ wx`` folds into the columns of ``wx``; the residual sum (an Add of two activations)
    gets an explicit Mul before the Gemm.
    """
    w = {name: gs.Constant(name, value) for name, value in residual_gemm_weights(seed).items()}
    x = gs.Variable("x", np.float32, ("N", 8))
    ln, m1, a, m2, r, z = (gs.Variable(n, np.float32) for n in ("ln", "m1", "a", "m2", "r", "z"))
    y, t = gs.Variable("y", np.float32, ("N", 5)), gs.Variable("t", np.float32, ("N", 4))
    nodes = [
        gs.Node("LayerNormalization", "ln", {"epsilon": EPS}, inputs=[x, w["ln.gamma"], w["ln.beta"]],
                outputs=[ln]),
        gs.Node("MatMul", "m1", inputs=[ln, w["w1"]], outputs=[m1]),
        gs.Node("Add", "m1_bias", inputs=[m1, w["b1"]], outputs=[a]),
        gs.Node("MatMul", "m2", inputs=[a, w["w2"]], outputs=[m2]),
        gs.Node("Add", "residual", inputs=[m2, ln], outputs=[r]),
        gs.Node("Gemm", "head", {"transB": 1}, inputs=[r, w["gb"], w["gc"]], outputs=[y]),
        gs.Node("MatMul", "zx", inputs=[x, w["wx"]], outputs=[z]),
        gs.Node("MatMul", "zt", inputs=[z, w["wt"]], outputs=[t]),
    ]
    return _finish(gs.Graph(nodes, [x], [y, t], name="residual_gemm"))


def residual_gemm_forward(x: np.ndarray, seed: int = 1) -> dict[str, np.ndarray]:
    """NumPy forward of :func:`residual_gemm`: every intermediate tensor by name (float64)."""
    w = {k: v.astype(np.float64) for k, v in residual_gemm_weights(seed).items()}
    ln = layernorm(x, w["ln.gamma"], w["ln.beta"])
    a = ln @ w["w1"] + w["b1"]
    r = a @ w["w2"] + ln
    z = x @ w["wx"]
    return {"x": x.astype(np.float64), "ln": ln, "a": a, "r": r, "z": z,
            "y": r @ w["gb"].T + w["gc"], "t": z @ w["wt"]}


def shared_weight(seed: int = 2) -> onnx.ModelProto:
    """x[N,6] -> MatMul(W) -> Relu -> MatMul(same W) -> y: one initializer read with two ``s``."""
    rng = np.random.default_rng(seed)
    weight = gs.Constant("w", _w(rng, (6, 6)))
    x = gs.Variable("x", np.float32, ("N", 6))
    a, r = gs.Variable("a", np.float32), gs.Variable("r", np.float32)
    y = gs.Variable("y", np.float32, ("N", 6))
    nodes = [gs.Node("MatMul", "first", inputs=[x, weight], outputs=[a]),
             gs.Node("Relu", "relu", inputs=[a], outputs=[r]),
             gs.Node("MatMul", "second", inputs=[r, weight], outputs=[y])]
    return _finish(gs.Graph(nodes, [x], [y], name="shared_weight"))
