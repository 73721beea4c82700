"""Small models built to trigger (or not) each doctor check, plus ready results for report tests."""
from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs
from models import OPSET, _finish


def outlier_channel_conv(seed: int = 0, scale_first: float = 1000.0) -> onnx.ModelProto:
    """x[N,3,8,8] -> Conv(3->4) -> y, output channel 0's weights ``scale_first`` times the others'.

    A per-tensor range is set by channel 0 and rounds most weights of channels 1-3 to zero; per
    channel, every channel keeps its weights.
    """
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((4, 3, 3, 3)) * 0.01).astype(np.float32)
    w[0] *= np.float32(scale_first)
    x = gs.Variable("x", np.float32, ("N", 3, 8, 8))
    y = gs.Variable("y", np.float32, ("N", 4, 8, 8))
    node = gs.Node("Conv", "conv", {"pads": [1, 1, 1, 1]}, inputs=[x, gs.Constant("conv.w", w)], outputs=[y])
    return _finish(gs.Graph([node], [x], [y], name="outlier_channel_conv"))


def conv_with_weights(w: np.ndarray) -> onnx.ModelProto:
    """x[N,C,4,4] -> Conv(w, no padding) -> y, with the weight given (shape [C_out, C, kH, kW])."""
    c_out, c_in, k_h, k_w = w.shape
    x = gs.Variable("x", np.float32, ("N", c_in, 4, 4))
    y = gs.Variable("y", np.float32, ("N", c_out, 5 - k_h, 5 - k_w))
    node = gs.Node("Conv", "conv", inputs=[x, gs.Constant("conv.w", w.astype(np.float32))], outputs=[y])
    return _finish(gs.Graph([node], [x], [y], name="conv_with_weights"))


def detection_head(seed: int = 0, box_scale: float = 300.0, score_scale: float = 0.3) -> onnx.ModelProto:
    """x[N,8] -> Gemm -> Relu -> y[N,6]: columns 0-3 are "box coordinates" (about 0..box_scale),
    columns 4-5 "class scores" (about 0..score_scale) -- one tensor mixing two value ranges."""
    rng = np.random.default_rng(seed)
    w = np.abs(rng.standard_normal((6, 8))).astype(np.float32)
    w[:4] *= np.float32(box_scale / 8)
    w[4:] *= np.float32(score_scale / 8)
    x = gs.Variable("x", np.float32, ("N", 8))
    h = gs.Variable("h", np.float32)
    y = gs.Variable("y", np.float32, ("N", 6))
    nodes = [gs.Node("Gemm", "head", {"transB": 1}, inputs=[x, gs.Constant("head.w", w)], outputs=[h]),
             gs.Node("Relu", "relu", inputs=[h], outputs=[y])]
    model = _finish(gs.Graph(nodes, [x], [y], name="detection_head"))
    assert model.opset_import[0].version == OPSET
    return model


def softmax_head() -> onnx.ModelProto:
    """x[N,16] -> Softmax -> y: most probabilities are tiny, but every channel reaches ~1 (no mix)."""
    x = gs.Variable("x", np.float32, ("N", 16))
    y = gs.Variable("y", np.float32, ("N", 16))
    node = gs.Node("Softmax", "softmax", {"axis": -1}, inputs=[x], outputs=[y])
    return _finish(gs.Graph([node], [x], [y], name="softmax_head"))


def positive_inputs(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Uniform [0, 1) inputs (keeps the detection head's outputs positive)."""
    return rng.random(shape, dtype=np.float32)


def report_results(seed: int = 0) -> dict:
    """One result of every renderable kind, from the residual block (a few seconds on one thread)."""
    import models

    from quantdbg.backends import OnnxrtRunnerFactory, OrtConfig
    from quantdbg.diagnostics import DoctorConfig, diagnose, lint
    from quantdbg.fallback import FallbackTarget, search_fallback
    from quantdbg.qdq import quantize
    from quantdbg.report import ReportBundle
    from quantdbg.sensitivity import SensitivityConfig, analyze_sensitivity

    rng = np.random.default_rng(seed)
    model = models.conv_residual()
    data = {"x": rng.standard_normal((32, 4, 8, 8), dtype=np.float32)}
    qmodel = quantize(model, data)
    factory = OnnxrtRunnerFactory(OrtConfig(intra_op_num_threads=1))
    local = analyze_sensitivity(model, qmodel, data, runner_factory=factory)
    isolated = analyze_sensitivity(model, qmodel, data, SensitivityConfig(mode="isolated", evidence=False),
                                   runner_factory=factory)
    plan = search_fallback(isolated, lambda exclude: float(len(exclude)), FallbackTarget.min_metric(1.0))
    doctor = diagnose(model, data, config=DoctorConfig(threads=1, bootstrap_rounds=4, bootstrap_chunks=4,
                                                       batch_size=8))
    results = {"calibration": qmodel.calibration, "sensitivity": local, "isolated": isolated,
               "fallback": plan, "lint": lint(qmodel.model), "doctor": doctor}
    results["bundle"] = ReportBundle("all results", tuple(v for k, v in results.items() if k != "isolated"))
    return results
