"""The lint's rules, registered in the order they run: what each detects, its source, how it finds it.

Sources (each :class:`Rule` names its own): the TensorRT Developer Guide, "Explicit Quantization"
(Q/DQ placement recommendations and limitations); onnx-tensorrt ``docs/operators.md`` (which ops
have INT8 kernels; zero points must be 0); trt-engine-explorer ``trex/lint.py`` (unfused Q/DQ
layers, channel alignment).
"""
from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

import numpy as np
import onnx

from quantdbg.diagnostics.findings import NO_EVIDENCE, Finding, Severity
from quantdbg.diagnostics.qdq_graph import (
    CLIP_TOLERANCE,
    QdqGraph,
    WeightQuantization,
    channel_counts,
    output_channel_axis,
    pair_name,
    preview,
    weight_quantization,
)
from quantdbg.model.load import QUANTIZED_OP_TYPES
from quantdbg.model.weights import WEIGHTED_OPS

# Ops whose "Supported Types" in onnx-tensorrt's operators.md include INT8.
_INT8_TYPED = frozenset({
    "AveragePool", "Cast", "Clip", "Concat", "Constant", "Conv", "ConvTranspose", "Elu", "Gather",
    "GatherElements", "GatherND", "Gemm", "GlobalAveragePool", "GlobalLpPool", "GlobalMaxPool",
    "HardSigmoid", "HardSwish", "Identity", "LeakyRelu", "LpPool", "MaxPool", "Pad", "ParametricSoftplus",
    "PRelu", "Relu", "Reshape", "Round", "ScaledTanh", "Scatter", "ScatterElements", "ScatterND", "Selu",
    "Shape", "Sigmoid", "Sign", "Size", "Slice", "Softplus", "Softsign", "Squeeze", "Tanh",
    "ThresholdedRelu", "Transpose", "Trilu", "Unsqueeze",
})
# Pure data movement: Q/DQ commute with it, so it neither needs nor blocks INT8.
_DATA_MOVEMENT = frozenset({"Flatten", "Split", "Expand", "Tile", "DepthToSpace", "SpaceToDepth"})
INT8_CAPABLE_OPS = _INT8_TYPED | WEIGHTED_OPS | _DATA_MOVEMENT | {"Add", "QuantizeLinear"}
"""Consumers that can take INT8 input: INT8 kernels (operators.md), weighted ops, the element-wise
Add that TensorRT fuses with Q/DQ (Developer Guide), data movement, and a requantizing Q."""

FLOAT_ONLY_OPS = frozenset({
    "Softmax", "LogSoftmax", "LayerNormalization", "InstanceNormalization", "GroupNormalization",
    "BatchNormalization", "MeanVarianceNormalization", "LpNormalization", "LRN", "ReduceMean",
    "ReduceSum", "ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceMax", "ReduceMin",
    "ReduceProd", "ReduceSumSquare", "Exp", "Log", "Sqrt", "Pow", "Reciprocal", "Div", "Erf", "Gelu",
    "Sin", "Cos", "Tan", "Asin", "Acos", "Atan", "Sinh", "Cosh", "Asinh", "Acosh", "Atanh", "Ceil",
    "Floor", "Abs", "Neg", "Celu", "Resize", "Upsample", "Einsum", "TopK", "CumSum", "ArgMax", "ArgMin",
    "GridSample", "RoiAlign",
    # Recurrent layers have no INT8 implementation in TensorRT: a DQ into them only adds a
    # reformat. Mul is left unclassified on purpose (TensorRT fuses some pointwise Muls).
    "LSTM", "GRU", "RNN",
})
"""Compute ops operators.md lists with FP32/FP16 only and no Q/DQ fusion: a DequantizeLinear
feeding one of them cannot fuse and runs as its own layer."""

ALIGNMENT = 16
"""INT8 Tensor Core kernels want channel counts that are multiples of this (trt-engine-explorer's
alignment linter: 16 for INT8, 8 for FP16)."""

_SMALL_INPUT_CHANNELS = 4  # first-layer convolutions (RGB) get dedicated small-channel INT8 formats


@dataclass(frozen=True)
class Rule:
    """One lint rule.

    Attributes:
        id: Stable identifier, e.g. ``"nonzero-zero-point"``.
        severity: Severity of its findings.
        title: One line saying what it detects.
        source: Where the rule comes from.
        find: Yields its findings on a graph.
    """

    id: str
    severity: Severity
    title: str
    source: str
    find: Callable[[QdqGraph], Iterator[Finding]] = field(repr=False, compare=False)


_REGISTRY: dict[str, Rule] = {}
RULES: Mapping[str, Rule] = MappingProxyType(_REGISTRY)
"""Every rule, by id, in the order they run."""

_GUIDE = "TensorRT Developer Guide, Explicit Quantization"
_BAD_INT_TYPES = (np.uint8, np.int16, np.uint16, np.int32, np.uint32)  # int8, int4 and fp8 are TensorRT's

FindRule = Callable[[QdqGraph], Iterator[Finding]]


def _rule(rule_id: str, severity: Severity, title: str, source: str) -> Callable[[FindRule], FindRule]:
    """Registers the decorated function as the finder of rule ``rule_id``."""
    def register(find: FindRule) -> FindRule:
        _REGISTRY[rule_id] = Rule(rule_id, severity, title, source, find)
        return find
    return register


def _finding(rule: str, node: str, message: str, fix: str) -> Finding:
    return Finding(rule, RULES[rule].severity, 0.0, message, (node,), NO_EVIDENCE, fix)


@_rule("unsupported-quantized-op", Severity.HIGH, "QLinear*/*Integer operator TensorRT does not import",
       f"{_GUIDE}: ONNX support (QLinearConv, QLinearMatMul, ConvInteger, MatMulInteger)")
def _rule_unsupported_ops(g: QdqGraph) -> Iterator[Finding]:
    for node in g.of_type(QUANTIZED_OP_TYPES - {"QuantizeLinear", "DequantizeLinear"}):
        yield _finding(
            "unsupported-quantized-op", node.name,
            f"{node.op_type} is an integer operator: TensorRT's ONNX parser imports only "
            "QuantizeLinear/DequantizeLinear (explicit quantization) and rejects it.",
            "Quantize in QDQ format instead (float ops between DequantizeLinear and QuantizeLinear), "
            "e.g. ONNX Runtime quant_format=QuantFormat.QDQ, or quantdbg.")


@_rule("nonzero-zero-point", Severity.HIGH, "Q/DQ zero point is not 0 (asymmetric quantization)",
       "onnx-tensorrt operators.md: QuantizeLinear/DequantizeLinear zero point must be 0")
def _rule_zero_point(g: QdqGraph) -> Iterator[Finding]:
    for node, q in g.pairs():
        params = [g.qparams(n) for n in (node, q) if n is not None]
        nonzero = [p.zero_point for p in params if p.zero_point is not None and np.any(p.zero_point != 0)]
        if nonzero:
            yield _finding(
                "nonzero-zero-point", node.name,
                f"Q/DQ {pair_name(node, q)} on {node.input[0]!r} has zero point "
                f"{preview(nonzero[0])}; TensorRT only supports symmetric quantization and its parser "
                "rejects a non-zero zero point.",
                "Calibrate symmetrically (zero point 0): quantdbg always does; ONNX Runtime: "
                "extra_options ActivationSymmetric/WeightSymmetric=True.")


@_rule("non-int8-qdq-type", Severity.HIGH, "Q/DQ integer type is not int8 (uint8, int16, int32 bias)",
       "onnx-tensorrt operators.md: DequantizeLinear supports INT8; TensorRT UINT8 cannot hold "
       "quantized values")
def _rule_int_type(g: QdqGraph) -> Iterator[Finding]:
    for node, q in g.pairs():
        dtypes = [p.int_dtype for p in (g.qparams(n) for n in (node, q) if n is not None)]
        bad = next((np.dtype(d) for d in dtypes if d is not None and np.dtype(d) in _BAD_INT_TYPES), None)
        if bad is None:
            continue
        if bad == np.uint8:
            why = "TensorRT's UINT8 type cannot hold quantized values (INT8 only), so the build fails."
            fix = "Quantize to signed int8 with zero point 0 (ONNX Runtime: activation_type=QuantType.QInt8)."
        else:
            why = (f"TensorRT's DequantizeLinear takes INT8 input (FP8/INT4 for weights), not {bad.name}; "
                   "a bias quantized to int32 (ONNX Runtime's default) is rejected by the parser.")
            fix = ("Keep biases in float -- TensorRT quantizes them itself (ONNX Runtime: "
                   "extra_options={'QuantizeBias': False}); use int8 for every other Q/DQ.")
        yield _finding("non-int8-qdq-type", node.name,
                       f"Q/DQ {pair_name(node, q)} on {node.input[0]!r} uses {bad.name}: {why}", fix)


@_rule("non-positive-scale", Severity.HIGH, "Q/DQ scale is zero, negative or not finite",
       f"{_GUIDE}: the quantization scale must consist of all positive float coefficients")
def _rule_scale(g: QdqGraph) -> Iterator[Finding]:
    for node, q in g.pairs():
        for part in [n for n in (node, q) if n is not None]:
            scale = g.qparams(part).scale
            if scale is not None and not np.all(np.isfinite(scale) & (scale > 0)):
                yield _finding(
                    "non-positive-scale", node.name,
                    f"{part.op_type} {part.name!r} has scale {preview(scale)}; TensorRT requires every "
                    "scale to be a positive finite number.",
                    "Recalibrate this tensor; an all-zero tensor needs a tiny positive scale, not 0.")
                break


@_rule("per-channel-activation", Severity.HIGH, "activation quantized per channel",
       f"{_GUIDE}: activations can only be quantized per tensor")
def _rule_per_channel_activation(g: QdqGraph) -> Iterator[Finding]:
    for node, _q in g.pairs():
        if g.is_weight(node):
            continue
        scale = g.qparams(node).scale
        if scale is not None and scale.size > 1:
            yield _finding(
                "per-channel-activation", node.name,
                f"Activation {node.input[0]!r} is quantized per channel ({scale.size} scales, axis "
                f"{g.qparams(node).axis}); TensorRT quantizes activations per tensor only.",
                "Use one scale for the whole activation tensor; keep per-channel scales for weights.")


@_rule("weight-axis", Severity.HIGH, "per-channel weight scale not on the output-channel axis",
       f"{_GUIDE}: with per-channel quantization the axis must be the output-channel axis")
def _ruleoutput_channel_axis(g: QdqGraph) -> Iterator[Finding]:
    for node, dq, weight in g.weight_inputs():
        params = g.qparams(dq)
        if params.scale is None or params.scale.size <= 1:
            continue
        want = output_channel_axis(node, weight.ndim)
        got = params.axis % weight.ndim
        if want is not None and got != want:
            yield _finding(
                "weight-axis", node.name,
                f"{node.op_type} {node.name!r} has weight {dq.input[0]!r} {weight.shape} quantized per "
                f"channel on axis {got}; TensorRT requires the output-channel axis, {want}, for "
                f"{node.op_type} weights.",
                f"Quantize the weight per output channel (DequantizeLinear axis={want}).")


@_rule("partially-quantized-op", Severity.MEDIUM, "weighted op with only some inputs dequantized",
       f"{_GUIDE}: quantize all inputs of weighted operations (Convolution, Deconvolution, GEMM)")
def _rule_partial(g: QdqGraph) -> Iterator[Finding]:
    for node in g.of_type(WEIGHTED_OPS):
        if len(node.input) < 2:
            continue
        quantized = [g.dq_of(name) is not None for name in node.input[:2]]
        if any(quantized) and not all(quantized):
            plain = node.input[quantized.index(False)]
            yield _finding(
                "partially-quantized-op", node.name,
                f"{node.op_type} {node.name!r} has a dequantized input but {plain!r} is not dequantized, so "
                "TensorRT cannot pick an INT8 kernel: the layer runs in float and the DequantizeLinear stays "
                "a separate layer.",
                f"Add a Q/DQ pair on {plain!r} (per channel if it is a weight), or remove the Q/DQ from "
                f"{node.name!r}'s other input to keep it in float.")


@_rule("dq-into-float-op", Severity.MEDIUM, "DequantizeLinear feeds an op with no INT8 kernel",
       "onnx-tensorrt operators.md supported types; trt-engine-explorer QDQ linter (unfused Q/DQ)")
def _rule_dq_into_float(g: QdqGraph) -> Iterator[Finding]:
    for node in g.of_type(FLOAT_ONLY_OPS):
        fed = [name for name in node.input if name and g.dq_of(name) is not None]
        if not fed:
            continue
        requantized = any(g.quantized_consumers(out) for out in node.output)
        what = (f"the DequantizeLinear on {fed[0]!r} before it and the QuantizeLinear after it cannot fuse "
                f"into it, so TensorRT dequantizes, runs {node.op_type} in float and quantizes again"
                if requantized else
                f"the DequantizeLinear on {fed[0]!r} cannot fuse into it and runs as its own layer")
        yield _finding(
            "dq-into-float-op", node.name,
            f"{node.op_type} has no INT8 kernel in TensorRT: {what}, adding scale and reformat layers.",
            f"Remove the Q/DQ pair on {node.name!r}'s input so it reads float; keep Q/DQ only on inputs of "
            "layers with INT8 kernels (the QuantizeLinear after it may stay if it feeds one).")


@_rule("add-without-producer", Severity.MEDIUM, "quantized Add with no weighted producer to fuse into",
       f"{_GUIDE}: element-wise addition fuses into a preceding weighted layer, or needs Q on its output")
def _rule_add(g: QdqGraph) -> Iterator[Finding]:
    for node in g.of_type({"Add"}):
        if not any(g.dq_of(n) is not None for n in node.input):
            continue
        if any(g.producer_op(n) in WEIGHTED_OPS for n in node.input):
            continue  # fuses into the weighted layer's epilogue
        if any(g.quantized_consumers(out) for out in node.output):
            continue  # a quantized element-wise layer: DQ inputs and Q output fuse into it
        blockers = [w.name for w in (g.weighted_source(n) for n in node.input) if w is not None]
        hint = (f" The Q/DQ between {blockers[0]!r} and this Add blocks the {blockers[0]!r}+Add fusion."
                if blockers else "")
        yield _finding(
            "add-without-producer", node.name,
            f"Add {node.name!r} has dequantized inputs, but no input comes straight from a Conv/Gemm/MatMul "
            f"it could fuse into, and its output is not quantized: it runs in float after separate "
            f"DequantizeLinear layers.{hint}",
            "Feed one input directly from the weighted layer's unquantized output (quantize only the "
            "residual input), or quantize the Add's output so TensorRT runs an INT8 element-wise layer.")


@_rule("concat-scale-mismatch", Severity.MEDIUM, "Concat inputs quantized with different scales",
       f"{_GUIDE}, Q/DQ Limitations: scale-comparing rewrites need equal scales")
def _rule_concat(g: QdqGraph) -> Iterator[Finding]:
    for node in g.of_type({"Concat"}):
        scales = {}
        for name in node.input:
            dq = g.dq_of(name)
            params = g.qparams(dq) if dq is not None else None
            if params is not None and params.scale is not None:
                scales[name] = params.scale.reshape(-1)
        distinct = {tuple(np.round(s.astype(np.float64), 12)) for s in scales.values()}
        if len(distinct) > 1:
            shown = ", ".join(f"{name!r}: {preview(s)}" for name, s in scales.items())
            yield _finding(
                "concat-scale-mismatch", node.name,
                f"Concat {node.name!r} joins inputs quantized with different scales ({shown}); TensorRT "
                "only moves Q/DQ through a Concat when the scales are equal, so it dequantizes, concatenates "
                "in float and requantizes.",
                "Give every quantized Concat input one shared scale (quantdbg "
                "QuantConfig(share_concat_scales=True) does).")


@_rule("qdq-on-weighted-output", Severity.MEDIUM, "weighted op output quantized for a float consumer",
       f"{_GUIDE}: by default, do not quantize the outputs of weighted operations")
def _rule_weighted_output(g: QdqGraph) -> Iterator[Finding]:
    for node in g.of_type(WEIGHTED_OPS):
        for q in g.quantized_consumers(node.output[0]):
            for dq in (c for c in g.consumers.get(q.output[0], []) if c.op_type == "DequantizeLinear"):
                floats = sorted({c.name for c in g.consumers.get(dq.output[0], [])
                                 if c.op_type not in INT8_CAPABLE_OPS})
                if floats:
                    yield _finding(
                        "qdq-on-weighted-output", node.name,
                        f"The output of {node.op_type} {node.name!r} is quantized ({q.name!r}), but "
                        f"{', '.join(map(repr, floats))} read it in float: TensorRT adds a "
                        "dequantize/reformat after the INT8 layer and the output loses precision for "
                        "nothing.",
                        f"Remove the Q/DQ after {node.name!r}; quantize only the inputs of the next INT8 "
                        "layers.")


@_rule("quantized-graph-output", Severity.MEDIUM, "graph output comes out of a DequantizeLinear",
       "trt-engine-explorer QDQ linter: unfused Dequantize layers are wasteful")
def _rule_graph_output(g: QdqGraph) -> Iterator[Finding]:
    for node in g.of_type({"DequantizeLinear"}):
        if any(out in g.outputs for out in node.output):
            yield _finding(
                "quantized-graph-output", node.name,
                f"Graph output {node.output[0]!r} comes out of DequantizeLinear {node.name!r}: the engine "
                "ends with an unfused dequantize layer and the output carries INT8 rounding error.",
                "Remove the Q/DQ pair before the graph output (quantdbg never quantizes outputs).")


_WEIGHT_FIX = ("Quantize the weight per output channel{axis} with scale max|w|/127 per channel -- a weight's "
               "range is its own maximum, never calibrated: quantdbg does (it also folds weights held in "
               "Constant nodes or behind Transpose/Cast into initializers first); ONNX Runtime "
               "per_channel=True; for other tools, re-export the weight as an initializer.")


def _sqnr_text(m: WeightQuantization) -> str:
    return (f"{m.sqnr_db:.1f} dB SQNR against {m.per_channel_sqnr_db:.1f} dB per output channel "
            f"({m.loss_db:.1f} dB lost)")


def _weight_quantizations(g: QdqGraph) -> Iterator[tuple[onnx.NodeProto, WeightQuantization, int | None]]:
    """(weighted op, its weight's quantization, output-channel axis) for every float weight."""
    for node, dq, weight in g.weight_inputs():
        measured = weight_quantization(g, node, dq, weight)
        if measured is not None:
            yield node, measured, output_channel_axis(node, weight.ndim)


@_rule("clipped-weight", Severity.HIGH, "weight scale below max|w|/127: the weight is clipped",
       f"{_GUIDE}: weights are quantized per output channel with their own range; a tool calibrating "
       "a weight like an activation (ModelOpt on Constant-node weights) clips it")
def _rule_clipped_weight(g: QdqGraph) -> Iterator[Finding]:
    for node, m, axis in _weight_quantizations(g):
        if not m.clipped:
            continue
        what = ("its one scale" if m.scales == 1 else f"{m.clipped} of its {m.scales} channel scales")
        yield _finding(
            "clipped-weight", node.name,
            f"{node.op_type} {node.name!r} quantizes weight {m.tensor!r} with {what} below "
            f"max|w|/127 (by more than {100 * CLIP_TOLERANCE:.0f}%), so its largest weights are clipped: "
            f"{_sqnr_text(m)}. A weight calibrated like an activation gets such a scale (e.g. a weight "
            "held in a Constant node, which a tool took for an activation).",
            _WEIGHT_FIX.format(axis="" if axis is None else f" (axis {axis})"))


@_rule("per-tensor-weight", Severity.MEDIUM, "weights quantized per tensor",
       f"{_GUIDE}: per-tensor activations and per-channel weights give the best accuracy")
def _rule_per_tensor_weight(g: QdqGraph) -> Iterator[Finding]:
    for node, m, axis in _weight_quantizations(g):
        if m.scales == 1 and m.channels > 1 and not m.clipped:
            yield _finding(
                "per-tensor-weight", node.name,
                f"{node.op_type} {node.name!r} quantizes its {m.channels}-channel weight {m.tensor!r} "
                f"with one scale: {_sqnr_text(m)}; a channel with small weights loses most of its precision. "
                "TensorRT recommends per-channel weights.",
                _WEIGHT_FIX.format(axis="" if axis is None else f" (axis {axis})"))


@_rule("channel-alignment", Severity.INFO, f"quantized layer channels not a multiple of {ALIGNMENT}",
       f"trt-engine-explorer alignment linter: INT8 Tensor Core kernels want channels % {ALIGNMENT} == 0")
def _rule_alignment(g: QdqGraph) -> Iterator[Finding]:
    for node, _dq, weight in g.weight_inputs():
        if g.dq_of(node.input[0]) is None:
            continue  # not an INT8 layer (partially-quantized-op reports it)
        counts = channel_counts(node, weight)
        if counts is None:
            continue
        c_in, c_out = counts
        bad = [f"{what} {n}" for what, n in (("input channels", c_in), ("output channels", c_out))
               if n % ALIGNMENT and not (what == "input channels" and n <= _SMALL_INPUT_CHANNELS)]
        if bad:
            yield _finding(
                "channel-alignment", node.name,
                f"{node.op_type} {node.name!r} has {' and '.join(bad)}, not multiples of {ALIGNMENT}: INT8 "
                "Tensor Core kernels pad them (TensorRT's INT8 layouts vectorize channels by 4 or 32) or "
                "fall back to slower kernels.",
                f"Round the channel counts up to a multiple of {ALIGNMENT} in the model, or keep this small "
                "layer in FP16.")


@_rule("no-qdq", Severity.INFO, "model has no Q/DQ nodes",
       f"{_GUIDE}: TensorRT uses INT8 only where Q/DQ nodes say so")
def _rule_no_qdq(g: QdqGraph) -> Iterator[Finding]:
    if not any(n.op_type in ("QuantizeLinear", "DequantizeLinear") for n in g.nodes):
        yield _finding(
            "no-qdq", g.nodes[0].name if g.nodes else "<graph>",
            "The model has no QuantizeLinear/DequantizeLinear nodes: a strongly typed TensorRT build runs it "
            "entirely in float.",
            "Quantize it first (`quantdbg calibrate MODEL --data CALIB.npz --out OUT.onnx`), then lint the "
            "result.")
