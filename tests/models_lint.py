"""Small Q/DQ models (<= 10 nodes besides Q/DQ) built in code, for the lint and TensorRT tests.

Each builder returns a checked ``onnx.ModelProto`` at opset 17 with a dynamic batch dimension that
also runs in ONNX Runtime. ``clean_conv_block`` follows TensorRT's placement recommendations and must
lint clean; every other builder breaks exactly one lint rule (named in its docstring).

Weights are quantized the TensorRT way: an FP32 initializer, then QuantizeLinear, then
DequantizeLinear, with per-output-channel scales max|w|/127; activations use one scale of 4/127
(inputs are standard normal, clipped at 4 sigma).
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
ACT_SCALE = 4.0 / 127.0


class QdqBuilder:
    """Collects nodes and initializers; ``build`` checks and shape-infers the model."""

    def __init__(self, name: str, seed: int = 0) -> None:
        self.name = name
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.inputs: list[onnx.ValueInfoProto] = []
        self.outputs: list[onnx.ValueInfoProto] = []

    def input(self, name: str, shape: Sequence[int | str], elem: int = TensorProto.FLOAT) -> str:
        self.inputs.append(helper.make_tensor_value_info(name, elem, list(shape)))
        return name

    def output(self, name: str) -> str:
        self.outputs.append(onnx.ValueInfoProto(name=name))  # type and shape filled in by build()
        return name

    def const(self, name: str, value: np.ndarray) -> str:
        self.inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def node(self, op: str, inputs: Sequence[str], name: str, out: str | None = None, **attrs: object) -> str:
        output = out or f"{name}_out"
        self.nodes.append(helper.make_node(op, list(inputs), [output], name=name, **attrs))
        return output

    def qdq(self, tensor: str, scale: float | np.ndarray = ACT_SCALE, zero_point: int | np.ndarray = 0,
            zp_dtype: type = np.int8, axis: int | None = None, name: str | None = None) -> str:
        """Q -> DQ on ``tensor``; returns the dequantized tensor name."""
        base = name or tensor
        scale_arr = np.asarray(scale, np.float32)
        zp_arr = np.broadcast_to(np.asarray(zero_point), scale_arr.shape).astype(zp_dtype)
        s = self.const(f"{base}.scale", scale_arr)
        z = self.const(f"{base}.zero_point", zp_arr)
        attrs = {} if axis is None else {"axis": axis}
        q = self.node("QuantizeLinear", [tensor, s, z], f"{base}.quantize", f"{base}.q", **attrs)
        return self.node("DequantizeLinear", [q, s, z], f"{base}.dequantize", f"{base}.dq", **attrs)

    def weight(self, name: str, shape: Sequence[int], axis: int | None = 0, scale: float = 0.3) -> str:
        """FP32 weight -> Q -> DQ, per channel on ``axis`` (None: one scale); returns the DQ output."""
        w = (self.rng.standard_normal(shape) * scale).astype(np.float32)
        self.const(name, w)
        if axis is None:
            return self.qdq(name, float(np.abs(w).max() / 127), name=name)
        reduce = tuple(i for i in range(w.ndim) if i != axis)
        return self.qdq(name, np.abs(w).max(axis=reduce) / 127, axis=axis, name=name)

    def float_weight(self, name: str, shape: Sequence[int], scale: float = 0.3,
                     dtype: type = np.float32) -> str:
        return self.const(name, (self.rng.standard_normal(shape) * scale).astype(dtype))

    def build(self) -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, self.name, self.inputs, self.outputs, self.inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
        model.ir_version = 8
        model = onnx.shape_inference.infer_shapes(model, strict_mode=True)
        inferred = {vi.name: vi for vi in model.graph.value_info}
        for out in model.graph.output:
            out.CopyFrom(inferred[out.name])
        onnx.checker.check_model(model)
        return model


def _conv(b: QdqBuilder, x: str, name: str, c_in: int, c_out: int, axis: int | None = 0) -> str:
    w = b.weight(f"{name}.w", (c_out, c_in, 3, 3), axis=axis)
    return b.node("Conv", [x, w], name, pads=[1, 1, 1, 1])


def clean_conv_block(seed: int = 0, channels: int = 16) -> onnx.ModelProto:
    """TensorRT-style placement, no findings: x -> Q/DQ -> conv1 -> relu1 -> Q/DQ -> conv2 ->
    Add(conv2 direct, quantized residual x) -> relu2 -> GlobalAveragePool -> Flatten -> Q/DQ ->
    Gemm(per-channel weights, transB) -> y."""
    b = QdqBuilder("clean_conv_block", seed)
    x = b.input("x", ("N", channels, 8, 8))
    xq = b.qdq(x)
    r1 = b.node("Relu", [_conv(b, xq, "conv1", channels, channels)], "relu1")
    c2 = _conv(b, b.qdq(r1), "conv2", channels, channels)
    r2 = b.node("Relu", [b.node("Add", [c2, xq], "add")], "relu2")
    flat = b.node("Flatten", [b.node("GlobalAveragePool", [r2], "gap")], "flatten")
    fc_w = b.weight("fc.w", (channels, channels), axis=0)
    b.node("Gemm", [b.qdq(flat), fc_w, b.float_weight("fc.b", (channels,))], "fc", "y", transB=1)
    b.output("y")
    return b.build()


def quantized_conv(name: str, zero_point: int = 0, zp_dtype: type = np.int8, scale: float = ACT_SCALE,
                   act_axis: int | None = None, weight_axis: int | None = 0,
                   c_out: int = 16) -> onnx.ModelProto:
    """x[N,16,8,8] -> Q/DQ (as given) -> Conv(3x3, weights as given) -> y."""
    b = QdqBuilder(name)
    x = b.input("x", ("N", 16, 8, 8))
    act_scale = np.full(16, scale, np.float32) if act_axis is not None else scale
    xq = b.qdq(x, act_scale, zero_point, zp_dtype, axis=act_axis)
    w = b.weight("conv.w", (c_out, 16, 3, 3), axis=weight_axis)
    b.node("Conv", [xq, w], "conv", "y", pads=[1, 1, 1, 1])
    b.output("y")
    return b.build()


def nonzero_zero_point() -> onnx.ModelProto:
    """nonzero-zero-point: the input's Q/DQ has zero point 5."""
    return quantized_conv("nonzero_zero_point", zero_point=5)


def uint8_qdq() -> onnx.ModelProto:
    """non-int8-qdq-type: the input's Q/DQ quantizes to uint8 (zero point 0)."""
    return quantized_conv("uint8_qdq", zp_dtype=np.uint8)


def negative_scale() -> onnx.ModelProto:
    """non-positive-scale: the input's Q/DQ has scale -0.03."""
    return quantized_conv("negative_scale", scale=-0.03)


def per_channel_activation() -> onnx.ModelProto:
    """per-channel-activation: the input is quantized with 16 scales on axis 1."""
    return quantized_conv("per_channel_activation", act_axis=1)


def weight_wrong_axis() -> onnx.ModelProto:
    """weight-axis: the Conv weight is quantized per channel on axis 1 (input channels)."""
    return quantized_conv("weight_wrong_axis", weight_axis=1)


def per_tensor_weight() -> onnx.ModelProto:
    """per-tensor-weight: the Conv weight has one scale."""
    return quantized_conv("per_tensor_weight", weight_axis=None)


def clipped_weight(held: str = "initializer") -> onnx.ModelProto:
    """clipped-weight: the Conv weight has one scale of max|w|/254 (half its range), as an activation
    calibrator gives a weight it took for an activation. ``held``: ``"initializer"``, ``"constant"``
    (a Constant node's output, as Paddle exports weights) or ``"transposed"`` (Transpose of a stored
    initializer, as tf2onnx does)."""
    b = QdqBuilder(f"clipped_weight_{held}")
    x = b.input("x", ("N", 16, 8, 8))
    w = (b.rng.standard_normal((16, 16, 3, 3)) * 0.3).astype(np.float32)
    if held == "constant":
        b.nodes.append(helper.make_node("Constant", [], ["conv.w"], name="conv.w/Constant",
                                        value=numpy_helper.from_array(w, "conv.w")))
    elif held == "transposed":
        b.const("conv.w.stored", np.ascontiguousarray(w.transpose(1, 0, 2, 3)))
        b.node("Transpose", ["conv.w.stored"], "conv.w/Transpose", "conv.w", perm=[1, 0, 2, 3])
    else:
        b.const("conv.w", w)
    wq = b.qdq("conv.w", float(np.abs(w).max() / 254), name="conv.w")
    b.node("Conv", [b.qdq(x), wq], "conv", "y", pads=[1, 1, 1, 1])
    b.output("y")
    return b.build()


def misaligned_channels() -> onnx.ModelProto:
    """channel-alignment: a quantized Conv with 12 output channels."""
    return quantized_conv("misaligned_channels", c_out=12)


def integer_matmul() -> onnx.ModelProto:
    """unsupported-quantized-op: x -> QuantizeLinear -> MatMulInteger(int8 weights) -> Cast -> y."""
    b = QdqBuilder("integer_matmul")
    x = b.input("x", ("N", 16))
    s, z = b.const("x.scale", np.float32(ACT_SCALE)), b.const("x.zero_point", np.int8(0))
    xq = b.node("QuantizeLinear", [x, s, z], "x.quantize")
    w = b.const("w", b.rng.integers(-127, 128, (16, 16)).astype(np.int8))
    acc = b.node("MatMulInteger", [xq, w], "matmul_integer")
    b.node("Cast", [acc], "to_float", "y", to=TensorProto.FLOAT)
    b.output("y")
    return b.build()


def partially_quantized_conv() -> onnx.ModelProto:
    """partially-quantized-op: the Conv input is dequantized, its weight is plain FP32."""
    b = QdqBuilder("partially_quantized_conv")
    x = b.input("x", ("N", 16, 8, 8))
    b.node("Conv", [b.qdq(x), b.float_weight("conv.w", (16, 16, 3, 3))], "conv", "y", pads=[1, 1, 1, 1])
    b.output("y")
    return b.build()


def softmax_between_qdq() -> onnx.ModelProto:
    """dq-into-float-op: x -> Q/DQ -> Softmax -> Q/DQ -> MatMul(per-channel weights) -> y."""
    b = QdqBuilder("softmax_between_qdq")
    x = b.input("x", ("N", 16))
    probs = b.node("Softmax", [b.qdq(x)], "softmax", axis=-1)
    b.node("MatMul", [b.qdq(probs, 1.0 / 127), b.weight("w", (16, 16), axis=1)], "matmul", "y")
    b.output("y")
    return b.build()


def add_without_producer() -> onnx.ModelProto:
    """add-without-producer: Add of two dequantized graph inputs, output not quantized."""
    b = QdqBuilder("add_without_producer")
    x1, x2 = b.input("x1", ("N", 16, 8, 8)), b.input("x2", ("N", 16, 8, 8))
    b.node("Add", [b.qdq(x1), b.qdq(x2)], "add", "y")
    b.output("y")
    return b.build()


def qdq_between_conv_and_add() -> onnx.ModelProto:
    """add-without-producer (with the fusion hint): conv -> Q/DQ -> Add(., quantized residual) -> y."""
    b = QdqBuilder("qdq_between_conv_and_add")
    x = b.input("x", ("N", 16, 8, 8))
    xq = b.qdq(x)
    c = _conv(b, xq, "conv", 16, 16)
    b.node("Add", [b.qdq(c), xq], "add", "y")
    b.output("y")
    return b.build()


def concat_scale_mismatch() -> onnx.ModelProto:
    """concat-scale-mismatch: Concat of two inputs quantized with scales 0.01 and 0.02."""
    b = QdqBuilder("concat_scale_mismatch")
    x1, x2 = b.input("x1", ("N", 16, 4, 4)), b.input("x2", ("N", 16, 4, 4))
    b.node("Concat", [b.qdq(x1, 0.01), b.qdq(x2, 0.02)], "concat", "y", axis=1)
    b.output("y")
    return b.build()


def quantized_conv_output_silu() -> onnx.ModelProto:
    """qdq-on-weighted-output: conv -> Q/DQ -> SiLU (Sigmoid, Mul) -> y; the Mul reads float."""
    b = QdqBuilder("quantized_conv_output_silu")
    x = b.input("x", ("N", 16, 8, 8))
    cq = b.qdq(_conv(b, b.qdq(x), "conv", 16, 16))
    b.node("Mul", [cq, b.node("Sigmoid", [cq], "sigmoid")], "silu_mul", "y")
    b.output("y")
    return b.build()


def quantized_graph_output() -> onnx.ModelProto:
    """quantized-graph-output: x -> Q/DQ -> conv -> relu -> Q/DQ -> y."""
    b = QdqBuilder("quantized_graph_output")
    x = b.input("x", ("N", 16, 8, 8))
    r = b.node("Relu", [_conv(b, b.qdq(x), "conv", 16, 16)], "relu")
    b.output(b.qdq(r, name="y"))
    return b.build()


def int8_conv_then_fp16_conv(seed: int = 0) -> onnx.ModelProto:
    """An FP16 fallback, TensorRT-style: x -> Q/DQ -> conv_int8 -> relu -> Cast(fp16) ->
    conv_fp16 (FP16 weights, no Q/DQ) -> Cast(fp32) -> y. Lints clean."""
    b = QdqBuilder("int8_conv_then_fp16_conv", seed)
    x = b.input("x", ("N", 16, 8, 8))
    r = b.node("Relu", [_conv(b, b.qdq(x), "conv_int8", 16, 16)], "relu")
    half = b.node("Cast", [r], "to_fp16", to=TensorProto.FLOAT16)
    w16 = b.float_weight("conv_fp16.w", (16, 16, 3, 3), dtype=np.float16)
    c16 = b.node("Conv", [half, w16], "conv_fp16", pads=[1, 1, 1, 1])
    b.node("Cast", [c16], "to_fp32", "y", to=TensorProto.FLOAT)
    b.output("y")
    return b.build()


RULE_MODELS = {
    "unsupported-quantized-op": integer_matmul,
    "nonzero-zero-point": nonzero_zero_point,
    "non-int8-qdq-type": uint8_qdq,
    "non-positive-scale": negative_scale,
    "per-channel-activation": per_channel_activation,
    "weight-axis": weight_wrong_axis,
    "partially-quantized-op": partially_quantized_conv,
    "dq-into-float-op": softmax_between_qdq,
    "add-without-producer": add_without_producer,
    "concat-scale-mismatch": concat_scale_mismatch,
    "qdq-on-weighted-output": quantized_conv_output_silu,
    "quantized-graph-output": quantized_graph_output,
    "per-tensor-weight": per_tensor_weight,
    "clipped-weight": clipped_weight,
    "channel-alignment": misaligned_channels,
}
"""Rule id -> builder of a model that breaks exactly that rule (no-qdq uses a float model)."""
