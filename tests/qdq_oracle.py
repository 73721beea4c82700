"""NumPy oracle of the Q/DQ tests: fake quantization and the maths of the test models, written
independently of quantdbg, and helpers that read a Q/DQ graph."""
from __future__ import annotations

from collections.abc import Callable

import models
import numpy as np
import onnx
from numpy.lib.stride_tricks import sliding_window_view
from onnx import numpy_helper

from quantdbg.backends import OnnxrtRunner, OrtConfig
from quantdbg.calibration import CalibrationResult, TensorRange
from quantdbg.placement import QdqPlan, plan_qdq
from quantdbg.qdq import QdqRecord, QuantizedModel, insert_qdq

EXACT = OrtConfig(intra_op_num_threads=1, graph_optimization_level="disable")
OPTIMIZED = OrtConfig(intra_op_num_threads=1)


def fq(x: np.ndarray, amax, axis: int | None = None) -> np.ndarray:
    """Quantize-dequantize: symmetric INT8, round half to even, saturate."""
    scale = (np.asarray(amax, np.float64) / 127).astype(np.float32)
    if axis is not None:
        shape = [1] * x.ndim
        shape[axis] = -1
        scale = scale.reshape(shape)
    return (np.clip(np.rint(x / scale), -128, 127) * scale).astype(np.float32)


def fq_weight(w: np.ndarray, axis: int) -> np.ndarray:
    amax = np.abs(w).max(axis=tuple(a for a in range(w.ndim) if a != axis))
    return fq(w, amax, axis)


def conv2d(x: np.ndarray, w: np.ndarray, pad: int = 0) -> np.ndarray:
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    windows = sliding_window_view(xp, w.shape[2:], axis=(2, 3))
    return np.einsum("nchwij,ocij->nohw", windows, w).astype(np.float32)


def relu(v: np.ndarray) -> np.ndarray:
    return np.maximum(v, 0)


class Oracle:
    """Runs a test model's maths in NumPy, fake-quantizing where ``amax`` says (None: FP32)."""

    def __init__(self, model: onnx.ModelProto, amax: dict[str, float] | None = None,
                 exclude: tuple[str, ...] = ()) -> None:
        self.w = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
        self.amax = amax
        self.exclude = exclude

    def act(self, node: str, tensor: str, value: np.ndarray) -> np.ndarray:
        if self.amax is None or node in self.exclude:
            return value
        return fq(value, self.amax[tensor])

    def weight(self, node: str, name: str, axis: int) -> np.ndarray:
        if self.amax is None or node in self.exclude:
            return self.w[name]
        return fq_weight(self.w[name], axis)


def forward_conv_residual(o: Oracle, x: np.ndarray) -> dict[str, np.ndarray]:
    t = {"x": x}
    t["r1"] = relu(conv2d(o.act("conv1", "x", x), o.weight("conv1", "conv1.w", 0), pad=1))
    t["c2"] = conv2d(o.act("conv2", "r1", t["r1"]), o.weight("conv2", "conv2.w", 0), pad=1)
    t["y"] = relu(t["c2"] + o.act("add", "x", x))
    return t


def forward_concat_convs(o: Oracle, x: np.ndarray) -> dict[str, np.ndarray]:
    t = {"x": x}
    t["a"] = conv2d(o.act("conv_a", "x", x), o.weight("conv_a", "conv_a.w", 0))
    t["b_scaled"] = 10 * conv2d(o.act("conv_b", "x", x), o.weight("conv_b", "conv_b.w", 0))
    t["cat"] = np.concatenate([o.act("concat", "a", t["a"]), o.act("concat", "b_scaled", t["b_scaled"])], 1)
    t["y"] = conv2d(o.act("conv_out", "cat", t["cat"]), o.weight("conv_out", "conv_out.w", 0))
    return t


def forward_mlp(o: Oracle, x: np.ndarray) -> dict[str, np.ndarray]:
    t = {"x": x}
    t["r"] = relu(o.act("fc1", "x", x) @ o.weight("fc1", "fc1.w", 0).T + o.w["fc1.b"])
    t["y"] = o.act("fc2", "r", t["r"]) @ o.weight("fc2", "fc2.w", 1) + o.w["fc2.b"]
    return t


def forward_attention(o: Oracle, x: np.ndarray) -> dict[str, np.ndarray]:
    t = {"x": x}
    t["q"] = o.act("q_proj", "x", x) @ o.weight("q_proj", "q.w", 1)
    t["kt"] = np.swapaxes(o.act("k_proj", "x", x) @ o.weight("k_proj", "k.w", 1), 1, 2)
    t["y"] = o.act("scores", "q", t["q"]) @ o.act("scores", "kt", t["kt"])
    return t


CASES: dict[str, tuple[Callable[[], onnx.ModelProto], Callable, tuple[int, ...]]] = {
    "conv_residual": (models.conv_residual, forward_conv_residual, (4, 4, 8, 8)),
    "concat_convs": (models.concat_convs, forward_concat_convs, (4, 3, 8, 8)),
    "mlp": (models.mlp, forward_mlp, (16, 8)),
    "attention": (models.attention_matmuls, forward_attention, (3, 5, 8)),
}


def calibrated(model: onnx.ModelProto, forward: Callable, x: np.ndarray, plan: QdqPlan,
               clip: float = 0.8) -> tuple[CalibrationResult, dict[str, float]]:
    """Ranges at ``clip`` x the FP32 absmax (so some values saturate), groups sharing the max."""
    fp = forward(Oracle(model), x)
    amax = {name: clip * float(np.abs(fp[name]).max()) for name in plan.activation_tensors}
    ranges = {name: TensorRange(name, -a, a, "minmax") for name, a in amax.items()}
    shared = dict(amax)
    for group in plan.shared_scale_groups:
        for name in group:
            shared[name] = max(amax[m] for m in group)
    return CalibrationResult(ranges, {}), shared


def run(model: onnx.ModelProto, feed: dict[str, np.ndarray], config: OrtConfig = EXACT) -> np.ndarray:
    with OnnxrtRunner(model, config) as runner:
        return runner.infer(feed)["y"]


# ----------------------------------------------------------------------------------------------
# Graph helpers for the invariants
# ----------------------------------------------------------------------------------------------


def producers(model: onnx.ModelProto) -> dict[str, onnx.NodeProto]:
    return {out: node for node in model.graph.node for out in node.output}


def node(model: onnx.ModelProto, name: str) -> onnx.NodeProto:
    return next(n for n in model.graph.node if n.name == name)


def initializer(model: onnx.ModelProto, name: str) -> np.ndarray:
    return next(numpy_helper.to_array(i) for i in model.graph.initializer if i.name == name)


def dq_feeding(model: onnx.ModelProto, node_name: str, index: int) -> onnx.NodeProto | None:
    producer = producers(model).get(node(model, node_name).input[index])
    return producer if producer is not None and producer.op_type == "DequantizeLinear" else None


def axis_of(n: onnx.NodeProto) -> int | None:
    return next((a.i for a in n.attribute if a.name == "axis"), None)


def check_record_matches_graph(qm: QuantizedModel, record: QdqRecord) -> None:
    """The record names the DQ that feeds its input, the Q before it, the tensor, scale and axis."""
    dq = dq_feeding(qm.model, record.node, record.input_index)
    assert dq is not None and dq.name == record.dequantize_node
    q = producers(qm.model)[dq.input[0]]
    assert q.op_type == "QuantizeLinear" and q.name == record.quantize_node
    assert q.input[0] == record.tensor
    assert q.input[1] == dq.input[1] and q.input[2] == dq.input[2]
    np.testing.assert_array_equal(np.atleast_1d(initializer(qm.model, dq.input[1])),
                                  np.asarray(record.scale, np.float32))
    zero_point = initializer(qm.model, dq.input[2])
    assert zero_point.dtype == np.int8 and not zero_point.any()
    assert axis_of(q) == axis_of(dq) == record.axis


def quantized(case: str, x: np.ndarray) -> tuple[onnx.ModelProto, QuantizedModel, dict[str, float]]:
    build, forward, _ = CASES[case]
    model = build()
    plan = plan_qdq(model)
    calibration, amax = calibrated(model, forward, x, plan)
    return model, insert_qdq(model, calibration, plan=plan), amax


def ort_quantize_static(model: onnx.ModelProto, feeds: list[dict[str, np.ndarray]],
                        tmp_path) -> onnx.ModelProto:
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.feeds = iter(feeds)

        def get_next(self):
            return next(self.feeds, None)

    src, dst = tmp_path / "fp32.onnx", tmp_path / "int8.onnx"
    onnx.save(model, src)
    quantize_static(str(src), str(dst), Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                    activation_type=QuantType.QInt8, weight_type=QuantType.QInt8)
    return onnx.load(dst)
