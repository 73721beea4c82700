"""Static lint of Q/DQ placement for TensorRT: what stops fusion, adds reformats, or fails to build.

TensorRT builds a Q/DQ ONNX model by *fusing* each DequantizeLinear into the layer that consumes it
and each QuantizeLinear into the layer that produces its input. A pair that cannot fuse stays as a
separate scale layer plus format conversions ("reformats"), which is the usual reason an INT8 engine
ends up slower than FP16 (TensorRT issues #993, #3197, #2067). This module finds such placements from
the graph alone -- no TensorRT needed -- the way trt-engine-explorer's engine linters did from a
built engine.

Sources for the rules (each :class:`Rule` names its own):

* TensorRT Developer Guide, "Explicit Quantization": Q/DQ layer-placement recommendations (quantize
  all inputs of weighted operations; by default do not quantize their outputs; element-wise Add fuses
  into a preceding weighted layer; per-tensor scales for activations and per-channel for weights,
  with the output-channel axis; scales positive; TensorRT does not import QLinear*/*Integer ops) and
  "Q/DQ Limitations" (rewrites that compare scales need equal scales).
* onnx-tensorrt ``docs/operators.md``: per-operator supported types (which ops have INT8 kernels),
  and ``x_zero_point``/``y_zero_point`` must be 0.
* trt-engine-explorer ``trex/lint.py``: unfused Q/DQ layers and channel alignment (16 for INT8).

The lint reads the graph syntactically: it does not simulate TensorRT's Q/DQ propagation through
commuting layers, so a finding is a strong hint, confirmed by building the engine and reading the
engine inspector (:meth:`quantdbg.backends.tensorrt.TrtRunner.layer_precisions`).
"""
from __future__ import annotations

import difflib
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from quantdbg import _display
from quantdbg.errors import ConfigError
from quantdbg.model import QUANTIZED_OP_TYPES, ModelSource, load_model
from quantdbg.quant_math import weight_axis

WEIGHTED_OPS = frozenset({"Conv", "ConvTranspose", "Gemm", "MatMul"})
"""Layers TensorRT runs as INT8 GEMM/convolution kernels when all their inputs are dequantized."""

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


class Severity(str, Enum):
    """How bad a finding is; the order is ERROR > WARNING > INFO."""

    ERROR = "error"      # TensorRT refuses the model or computes something else
    WARNING = "warning"  # builds, but a Q/DQ pair cannot fuse: extra layers, reformats, slower INT8
    INFO = "info"        # builds and fuses, but leaves speed or accuracy on the table

    @property
    def rank(self) -> int:
        """2 for ERROR, 1 for WARNING, 0 for INFO."""
        return {"error": 2, "warning": 1, "info": 0}[self.value]


@dataclass(frozen=True)
class Rule:
    """One lint rule.

    Attributes:
        id: Stable identifier, e.g. ``"nonzero-zero-point"``.
        severity: Severity of its findings.
        title: One line saying what it detects.
        source: Where the rule comes from.
    """

    id: str
    severity: Severity
    title: str
    source: str


_GUIDE = "TensorRT Developer Guide, Explicit Quantization"
_RULE_LIST = (
    Rule("unsupported-quantized-op", Severity.ERROR, "QLinear*/*Integer operator TensorRT does not import",
         f"{_GUIDE}: ONNX support (QLinearConv, QLinearMatMul, ConvInteger, MatMulInteger)"),
    Rule("nonzero-zero-point", Severity.ERROR, "Q/DQ zero point is not 0 (asymmetric quantization)",
         "onnx-tensorrt operators.md: QuantizeLinear/DequantizeLinear zero point must be 0"),
    Rule("non-int8-qdq-type", Severity.ERROR, "Q/DQ integer type is not int8 (uint8, int16, int32 bias)",
         "onnx-tensorrt operators.md: DequantizeLinear supports INT8; TensorRT UINT8 cannot hold "
         "quantized values"),
    Rule("non-positive-scale", Severity.ERROR, "Q/DQ scale is zero, negative or not finite",
         f"{_GUIDE}: the quantization scale must consist of all positive float coefficients"),
    Rule("per-channel-activation", Severity.ERROR, "activation quantized per channel",
         f"{_GUIDE}: activations can only be quantized per tensor"),
    Rule("weight-axis", Severity.ERROR, "per-channel weight scale not on the output-channel axis",
         f"{_GUIDE}: with per-channel quantization the axis must be the output-channel axis"),
    Rule("partially-quantized-op", Severity.WARNING, "weighted op with only some inputs dequantized",
         f"{_GUIDE}: quantize all inputs of weighted operations (Convolution, Deconvolution, GEMM)"),
    Rule("dq-into-float-op", Severity.WARNING, "DequantizeLinear feeds an op with no INT8 kernel",
         "onnx-tensorrt operators.md supported types; trt-engine-explorer QDQ linter (unfused Q/DQ)"),
    Rule("add-without-producer", Severity.WARNING, "quantized Add with no weighted producer to fuse into",
         f"{_GUIDE}: element-wise addition fuses into a preceding weighted layer, or needs Q on its output"),
    Rule("concat-scale-mismatch", Severity.WARNING, "Concat inputs quantized with different scales",
         f"{_GUIDE}, Q/DQ Limitations: scale-comparing rewrites need equal scales"),
    Rule("qdq-on-weighted-output", Severity.WARNING, "weighted op output quantized for a float consumer",
         f"{_GUIDE}: by default, do not quantize the outputs of weighted operations"),
    Rule("quantized-graph-output", Severity.WARNING, "graph output comes out of a DequantizeLinear",
         "trt-engine-explorer QDQ linter: unfused Dequantize layers are wasteful"),
    Rule("per-tensor-weight", Severity.WARNING, "weights quantized per tensor",
         f"{_GUIDE}: per-tensor activations and per-channel weights give the best accuracy"),
    Rule("channel-alignment", Severity.INFO, f"quantized layer channels not a multiple of {ALIGNMENT}",
         f"trt-engine-explorer alignment linter: INT8 Tensor Core kernels want channels % {ALIGNMENT} == 0"),
    Rule("no-qdq", Severity.INFO, "model has no Q/DQ nodes",
         f"{_GUIDE}: TensorRT uses INT8 only where Q/DQ nodes say so"),
)
RULES: Mapping[str, Rule] = {rule.id: rule for rule in _RULE_LIST}
"""Every rule, by id, in the order they run."""


@dataclass(frozen=True)
class Finding:
    """One lint finding.

    Attributes:
        rule: Rule id (see :data:`RULES`).
        severity: The rule's severity.
        node: ONNX node the finding is about.
        message: What is wrong and why it matters to TensorRT.
        fix: How to fix it.
    """

    rule: str
    severity: Severity
    node: str
    message: str
    fix: str

    def to_dict(self) -> dict[str, str]:
        """JSON-ready form."""
        return {"rule": self.rule, "severity": self.severity.value, "node": self.node,
                "message": self.message, "fix": self.fix}

    @classmethod
    def from_dict(cls, data: Mapping[str, str]) -> Finding:
        """Inverse of :meth:`to_dict`."""
        return cls(data["rule"], Severity(data["severity"]), data["node"], data["message"], data["fix"])


def _sort_key(finding: Finding) -> tuple[int, int, str]:
    order = list(RULES).index(finding.rule) if finding.rule in RULES else len(RULES)
    return (-finding.severity.rank, order, finding.node)


@dataclass(frozen=True)
class LintReport:
    """The findings of :func:`lint`, most severe first.

    Attributes:
        findings: Sorted by severity, then rule, then node name.
        model: What was linted (a path or the graph name), for rendering.
    """

    findings: tuple[Finding, ...]
    model: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "findings", tuple(sorted(self.findings, key=_sort_key)))

    def counts(self) -> dict[str, int]:
        """Number of findings per severity (every severity present, possibly 0)."""
        return {s.value: sum(f.severity is s for f in self.findings) for s in Severity}

    def at_or_above(self, severity: Severity) -> tuple[Finding, ...]:
        """The findings of ``severity`` or worse."""
        return tuple(f for f in self.findings if f.severity.rank >= severity.rank)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {"model": self.model, "counts": self.counts(),
                "findings": [f.to_dict() for f in self.findings]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LintReport:
        """Inverse of :meth:`to_dict` (counts are recomputed)."""
        return cls(tuple(Finding.from_dict(f) for f in data["findings"]), data.get("model", ""))

    def to_markdown(self) -> str:
        """A Markdown section: a summary line and one table row per finding."""
        counts = self.counts()
        title = f"## TensorRT Q/DQ lint{f': `{self.model}`' if self.model else ''}"
        summary = f"Errors: {counts['error']}, warnings: {counts['warning']}, info: {counts['info']}"
        if not self.findings:
            return f"{title}\n\nNo findings.\n"
        rows = ["| Severity | Rule | Node | Finding | Fix |", "|---|---|---|---|---|"]
        for f in self.findings:
            cells = (f.severity.value, f"`{f.rule}`", f"`{f.node}`", f.message, f.fix)
            rows.append("| " + " | ".join(_md_cell(c) for c in cells) + " |")
        return f"{title}\n\n{summary}.\n\n" + "\n".join(rows) + "\n"

    def _repr_html_(self) -> str:
        return _display.html(self)


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


# --------------------------------------------------------------------------------------------
# Graph index
# --------------------------------------------------------------------------------------------

class _Graph:
    """Producer/consumer maps and constants of one ONNX graph (read-only)."""

    def __init__(self, model: onnx.ModelProto) -> None:
        graph = model.graph
        self.nodes = list(graph.node)
        self.outputs = {vi.name for vi in graph.output}
        self.producer: dict[str, onnx.NodeProto] = {}
        self.consumers: dict[str, list[onnx.NodeProto]] = {}
        self.constants: dict[str, np.ndarray] = {init.name: numpy_helper.to_array(init)
                                                  for init in graph.initializer}
        for node in self.nodes:
            for name in node.output:
                self.producer[name] = node
            for name in node.input:
                if name:
                    self.consumers.setdefault(name, []).append(node)
            if node.op_type == "Constant" and node.output:
                value = _constant_value(node)
                if value is not None:
                    self.constants[node.output[0]] = value

    def producer_op(self, tensor: str) -> str | None:
        node = self.producer.get(tensor)
        return node.op_type if node is not None else None

    def dq_of(self, tensor: str) -> onnx.NodeProto | None:
        """The DequantizeLinear producing ``tensor``, if any."""
        node = self.producer.get(tensor)
        return node if node is not None and node.op_type == "DequantizeLinear" else None

    def q_before(self, dq: onnx.NodeProto) -> onnx.NodeProto | None:
        """The QuantizeLinear feeding ``dq``, if any."""
        node = self.producer.get(dq.input[0])
        return node if node is not None and node.op_type == "QuantizeLinear" else None

    def weight_of(self, dq: onnx.NodeProto) -> np.ndarray | None:
        """The constant a DequantizeLinear dequantizes (directly or through a Q), or None."""
        source = dq.input[0]
        q = self.q_before(dq)
        if q is not None:
            source = q.input[0]
        return self.constants.get(source)

    def quantized_consumers(self, tensor: str) -> list[onnx.NodeProto]:
        """QuantizeLinear nodes reading ``tensor``."""
        return [c for c in self.consumers.get(tensor, []) if c.op_type == "QuantizeLinear"]


def _constant_value(node: onnx.NodeProto) -> np.ndarray | None:
    for attr in node.attribute:
        if attr.name == "value":
            return numpy_helper.to_array(attr.t)
    return None


def _attr(node: onnx.NodeProto, name: str, default: Any) -> Any:
    for attr in node.attribute:
        if attr.name == name:
            return onnx.helper.get_attribute_value(attr)
    return default


@dataclass(frozen=True)
class _QParams:
    scale: np.ndarray | None
    zero_point: np.ndarray | None
    axis: int
    int_dtype: np.dtype | None


def _qparams(g: _Graph, node: onnx.NodeProto) -> _QParams:
    scale = g.constants.get(node.input[1]) if len(node.input) > 1 else None
    zp = g.constants.get(node.input[2]) if len(node.input) > 2 and node.input[2] else None
    dtype = zp.dtype if zp is not None else None
    if dtype is None and node.op_type == "DequantizeLinear" and node.input[0] in g.constants:
        dtype = g.constants[node.input[0]].dtype  # pre-quantized integer weights
    return _QParams(scale, zp, int(_attr(node, "axis", 1)), dtype)


def _pairs(g: _Graph) -> Iterator[tuple[onnx.NodeProto, onnx.NodeProto | None]]:
    """(reported node, its Q partner) for every DQ, and every Q that feeds no DQ."""
    for node in g.nodes:
        if node.op_type == "DequantizeLinear":
            yield node, g.q_before(node)
        elif node.op_type == "QuantizeLinear":
            if not any(c.op_type == "DequantizeLinear" for c in g.consumers.get(node.output[0], [])):
                yield node, None


def _is_weight(g: _Graph, node: onnx.NodeProto) -> bool:
    if node.op_type == "DequantizeLinear":
        return g.weight_of(node) is not None
    return node.input[0] in g.constants


def _pair_name(node: onnx.NodeProto, q: onnx.NodeProto | None) -> str:
    return f"{q.name!r} -> {node.name!r}" if q is not None else repr(node.name)


# --------------------------------------------------------------------------------------------
# Rules
# --------------------------------------------------------------------------------------------

def _finding(rule: str, node: str, message: str, fix: str) -> Finding:
    return Finding(rule, RULES[rule].severity, node, message, fix)


def _rule_unsupported_ops(g: _Graph) -> Iterator[Finding]:
    for node in g.nodes:
        if node.op_type in QUANTIZED_OP_TYPES - {"QuantizeLinear", "DequantizeLinear"}:
            yield _finding(
                "unsupported-quantized-op", node.name,
                f"{node.op_type} is an integer operator: TensorRT's ONNX parser imports only "
                "QuantizeLinear/DequantizeLinear (explicit quantization) and rejects it.",
                "Quantize in QDQ format instead (float ops between DequantizeLinear and QuantizeLinear), "
                "e.g. ONNX Runtime quant_format=QuantFormat.QDQ, or quantdbg.")


def _rule_zero_point(g: _Graph) -> Iterator[Finding]:
    for node, q in _pairs(g):
        params = [_qparams(g, n) for n in (node, q) if n is not None]
        nonzero = [p.zero_point for p in params if p.zero_point is not None and np.any(p.zero_point != 0)]
        if nonzero:
            yield _finding(
                "nonzero-zero-point", node.name,
                f"Q/DQ {_pair_name(node, q)} on {node.input[0]!r} has zero point "
                f"{_preview(nonzero[0])}; TensorRT only supports symmetric quantization and its parser "
                "rejects a non-zero zero point.",
                "Calibrate symmetrically (zero point 0): quantdbg always does; ONNX Runtime: "
                "extra_options ActivationSymmetric/WeightSymmetric=True.")


_BAD_INT_TYPES = (np.uint8, np.int16, np.uint16, np.int32, np.uint32)  # int8, int4 and fp8 are TensorRT's


def _rule_int_type(g: _Graph) -> Iterator[Finding]:
    for node, q in _pairs(g):
        dtypes = [p.int_dtype for p in (_qparams(g, n) for n in (node, q) if n is not None)]
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
                       f"Q/DQ {_pair_name(node, q)} on {node.input[0]!r} uses {bad.name}: {why}", fix)


def _rule_scale(g: _Graph) -> Iterator[Finding]:
    for node, q in _pairs(g):
        for part in [n for n in (node, q) if n is not None]:
            scale = _qparams(g, part).scale
            if scale is not None and not np.all(np.isfinite(scale) & (scale > 0)):
                yield _finding(
                    "non-positive-scale", node.name,
                    f"{part.op_type} {part.name!r} has scale {_preview(scale)}; TensorRT requires every "
                    "scale to be a positive finite number.",
                    "Recalibrate this tensor; an all-zero tensor needs a tiny positive scale, not 0.")
                break


def _rule_per_channel_activation(g: _Graph) -> Iterator[Finding]:
    for node, _q in _pairs(g):
        if _is_weight(g, node):
            continue
        scale = _qparams(g, node).scale
        if scale is not None and scale.size > 1:
            yield _finding(
                "per-channel-activation", node.name,
                f"Activation {node.input[0]!r} is quantized per channel ({scale.size} scales, axis "
                f"{_qparams(g, node).axis}); TensorRT quantizes activations per tensor only.",
                "Use one scale for the whole activation tensor; keep per-channel scales for weights.")


def _weight_axis(node: onnx.NodeProto, rank: int) -> int | None:
    """Output-channel axis of input 1 of a weighted op (None: the weight has no channel axis)."""
    return weight_axis(node.op_type, rank, bool(int(_attr(node, "transB", 0))))


def _weight_inputs(g: _Graph) -> Iterator[tuple[onnx.NodeProto, onnx.NodeProto, np.ndarray]]:
    """(weighted op, DQ on its input 1, the weight constant) for every dequantized weight."""
    for node in g.nodes:
        if node.op_type in WEIGHTED_OPS and len(node.input) > 1:
            dq = g.dq_of(node.input[1])
            weight = g.weight_of(dq) if dq is not None else None
            if dq is not None and weight is not None and weight.ndim >= 1:
                yield node, dq, weight


def _rule_weight_axis(g: _Graph) -> Iterator[Finding]:
    for node, dq, weight in _weight_inputs(g):
        params = _qparams(g, dq)
        if params.scale is None or params.scale.size <= 1:
            continue
        want = _weight_axis(node, weight.ndim)
        got = params.axis % weight.ndim
        if want is not None and got != want:
            yield _finding(
                "weight-axis", node.name,
                f"{node.op_type} {node.name!r} has weight {dq.input[0]!r} {weight.shape} quantized per "
                f"channel on axis {got}; TensorRT requires the output-channel axis, {want}, for "
                f"{node.op_type} weights.",
                f"Quantize the weight per output channel (DequantizeLinear axis={want}).")


def _rule_per_tensor_weight(g: _Graph) -> Iterator[Finding]:
    for node, dq, weight in _weight_inputs(g):
        scale = _qparams(g, dq).scale
        axis = _weight_axis(node, weight.ndim)
        channels = 1 if axis is None else weight.shape[axis]
        if scale is not None and scale.size == 1 and channels > 1:
            yield _finding(
                "per-tensor-weight", node.name,
                f"{node.op_type} {node.name!r} quantizes its {channels}-channel weight with one scale; a "
                "channel with small weights loses most of its precision. TensorRT recommends per-channel "
                "weights.",
                f"Quantize the weight per output channel (axis {axis}): quantdbg "
                "QuantConfig(per_channel=True); ONNX Runtime per_channel=True.")


def _rule_partial(g: _Graph) -> Iterator[Finding]:
    for node in g.nodes:
        if node.op_type not in WEIGHTED_OPS or len(node.input) < 2:
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


def _rule_dq_into_float(g: _Graph) -> Iterator[Finding]:
    for node in g.nodes:
        if node.op_type not in FLOAT_ONLY_OPS:
            continue
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


def _weighted_source(g: _Graph, tensor: str) -> onnx.NodeProto | None:
    """The weighted op whose output reaches ``tensor`` through exactly one Q -> DQ pair."""
    dq = g.dq_of(tensor)
    q = g.q_before(dq) if dq is not None else None
    producer = g.producer.get(q.input[0]) if q is not None else None
    return producer if producer is not None and producer.op_type in WEIGHTED_OPS else None


def _rule_add(g: _Graph) -> Iterator[Finding]:
    for node in g.nodes:
        if node.op_type != "Add" or not any(g.dq_of(n) is not None for n in node.input):
            continue
        if any(g.producer_op(n) in WEIGHTED_OPS for n in node.input):
            continue  # fuses into the weighted layer's epilogue
        if any(g.quantized_consumers(out) for out in node.output):
            continue  # a quantized element-wise layer: DQ inputs and Q output fuse into it
        blockers = [w.name for w in (_weighted_source(g, n) for n in node.input) if w is not None]
        hint = (f" The Q/DQ between {blockers[0]!r} and this Add blocks the {blockers[0]!r}+Add fusion."
                if blockers else "")
        yield _finding(
            "add-without-producer", node.name,
            f"Add {node.name!r} has dequantized inputs, but no input comes straight from a Conv/Gemm/MatMul "
            f"it could fuse into, and its output is not quantized: it runs in float after separate "
            f"DequantizeLinear layers.{hint}",
            "Feed one input directly from the weighted layer's unquantized output (quantize only the "
            "residual input), or quantize the Add's output so TensorRT runs an INT8 element-wise layer.")


def _rule_concat(g: _Graph) -> Iterator[Finding]:
    for node in g.nodes:
        if node.op_type != "Concat":
            continue
        scales = {}
        for name in node.input:
            dq = g.dq_of(name)
            params = _qparams(g, dq) if dq is not None else None
            if params is not None and params.scale is not None:
                scales[name] = params.scale.reshape(-1)
        distinct = {tuple(np.round(s.astype(np.float64), 12)) for s in scales.values()}
        if len(distinct) > 1:
            shown = ", ".join(f"{name!r}: {_preview(s)}" for name, s in scales.items())
            yield _finding(
                "concat-scale-mismatch", node.name,
                f"Concat {node.name!r} joins inputs quantized with different scales ({shown}); TensorRT "
                "only moves Q/DQ through a Concat when the scales are equal, so it dequantizes, concatenates "
                "in float and requantizes.",
                "Give every quantized Concat input one shared scale (quantdbg "
                "QuantConfig(share_concat_scales=True) does).")


def _rule_weighted_output(g: _Graph) -> Iterator[Finding]:
    for node in g.nodes:
        if node.op_type not in WEIGHTED_OPS:
            continue
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


def _rule_graph_output(g: _Graph) -> Iterator[Finding]:
    for node in g.nodes:
        if node.op_type == "DequantizeLinear" and any(out in g.outputs for out in node.output):
            yield _finding(
                "quantized-graph-output", node.name,
                f"Graph output {node.output[0]!r} comes out of DequantizeLinear {node.name!r}: the engine "
                "ends with an unfused dequantize layer and the output carries INT8 rounding error.",
                "Remove the Q/DQ pair before the graph output (quantdbg never quantizes outputs).")


def _channels(node: onnx.NodeProto, weight: np.ndarray) -> tuple[int, int] | None:
    """(input channels, output channels) of a weighted op, from its weight."""
    group = int(_attr(node, "group", 1))
    if node.op_type == "Conv" and weight.ndim >= 3:
        return int(weight.shape[1]) * group, int(weight.shape[0])
    if node.op_type == "ConvTranspose" and weight.ndim >= 3:
        return int(weight.shape[0]), int(weight.shape[1]) * group
    if node.op_type == "Gemm" and weight.ndim == 2:
        rows, cols = (int(d) for d in weight.shape)
        return (cols, rows) if int(_attr(node, "transB", 0)) else (rows, cols)
    if node.op_type == "MatMul" and weight.ndim >= 2:
        return int(weight.shape[-2]), int(weight.shape[-1])
    return None


def _rule_alignment(g: _Graph) -> Iterator[Finding]:
    for node, _dq, weight in _weight_inputs(g):
        if g.dq_of(node.input[0]) is None:
            continue  # not an INT8 layer (partially-quantized-op reports it)
        channels = _channels(node, weight)
        if channels is None:
            continue
        c_in, c_out = channels
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


def _rule_no_qdq(g: _Graph) -> Iterator[Finding]:
    if not any(n.op_type in ("QuantizeLinear", "DequantizeLinear") for n in g.nodes):
        yield _finding(
            "no-qdq", g.nodes[0].name if g.nodes else "<graph>",
            "The model has no QuantizeLinear/DequantizeLinear nodes: a strongly typed TensorRT build runs it "
            "entirely in float.",
            "Quantize it first (`quantdbg calibrate MODEL --data CALIB.npz --out OUT.onnx`), then lint the "
            "result.")


def _preview(values: np.ndarray, limit: int = 4) -> str:
    flat = np.asarray(values).reshape(-1)
    shown = ", ".join(f"{v:.6g}" for v in flat[:limit].tolist())
    return f"[{shown}{', ...' if flat.size > limit else ''}]" if flat.size > 1 else shown


_RULE_FUNCS: Mapping[str, Callable[[_Graph], Iterator[Finding]]] = {
    "unsupported-quantized-op": _rule_unsupported_ops,
    "nonzero-zero-point": _rule_zero_point,
    "non-int8-qdq-type": _rule_int_type,
    "non-positive-scale": _rule_scale,
    "per-channel-activation": _rule_per_channel_activation,
    "weight-axis": _rule_weight_axis,
    "partially-quantized-op": _rule_partial,
    "dq-into-float-op": _rule_dq_into_float,
    "add-without-producer": _rule_add,
    "concat-scale-mismatch": _rule_concat,
    "qdq-on-weighted-output": _rule_weighted_output,
    "quantized-graph-output": _rule_graph_output,
    "per-tensor-weight": _rule_per_tensor_weight,
    "channel-alignment": _rule_alignment,
    "no-qdq": _rule_no_qdq,
}


def lint(model: ModelSource, *, skip: Collection[str] = ()) -> LintReport:
    """Checks a Q/DQ model's quantization placement against TensorRT's fusion rules.

    Args:
        model: The Q/DQ ONNX model (path or ModelProto; never modified). Models quantized by ONNX
            Runtime or ModelOpt are accepted. Unnamed nodes are reported as ``<op_type>_<index>``.
        skip: Rule ids to leave out (see :data:`RULES`).

    Returns:
        The findings, most severe first.

    Raises:
        ModelError: The model does not load or validate.
        ConfigError: ``skip`` names an unknown rule.
    """
    for rule in skip:
        if rule not in RULES:
            near = difflib.get_close_matches(rule, list(RULES), n=3)
            hint = (f" Did you mean {', '.join(map(repr, near))}?" if near
                    else f" Known rules: {', '.join(RULES)}.")
            raise ConfigError(f"No lint rule named {rule!r}.{hint}")
    proto = load_model(model, allow_quantized=True)
    graph = _Graph(proto)
    findings = [finding for rule, check in _RULE_FUNCS.items() if rule not in skip
                for finding in check(graph)]
    label = str(model) if not isinstance(model, onnx.ModelProto) else (proto.graph.name or "")
    return LintReport(tuple(findings), label)
