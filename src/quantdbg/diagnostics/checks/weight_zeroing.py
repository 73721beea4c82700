"""Weights zeroed by their range: how many non-zero weights round to 0 in INT8, per tensor and per channel."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import onnx

from quantdbg._json import Serializable
from quantdbg.config import TensorKind
from quantdbg.diagnostics.checks.base import Check, CheckContext, CheckOutcome
from quantdbg.diagnostics.findings import Evidence, Finding, Severity
from quantdbg.model.external import tensor_array
from quantdbg.model.graph import trans_b
from quantdbg.qdq import QuantizedModel
from quantdbg.quant_math import QMAX, channel_axis, channel_scale, zeroed_fraction

HIGH_SHARE = 0.2
"""Zeroed share from which the finding is high (accuracy is being lost now)."""


@dataclass(frozen=True)
class WeightZeroing(Serializable):
    """How many weights of one node round to zero in INT8.

    Attributes:
        node: Consumer node.
        op_type: Its op type.
        tensor: The weight initializer.
        nonzero: Non-zero FP32 weights.
        per_tensor: Share of them that quantize to 0 with one scale ``max|w| / 127``.
        per_channel: The same with one scale per output channel.
        scheme: What the Q/DQ model uses: ``"per-channel"`` or ``"per-tensor"``.
    """

    node: str
    op_type: str
    tensor: str
    nonzero: int
    per_tensor: float
    per_channel: float
    scheme: Literal["per-channel", "per-tensor"]

    @property
    def actual(self) -> float:
        """The zeroed share under the scheme the model uses."""
        return self.per_channel if self.scheme == "per-channel" else self.per_tensor


def weight_zeroing(fp_model: onnx.ModelProto, qmodel: QuantizedModel) -> list[WeightZeroing]:
    """Measures, for every quantized weight, the zeroed share per tensor and per channel.

    Args:
        fp_model: The FP32 model holding the weights.
        qmodel: The Q/DQ model's records (which weights are quantized, per-channel or not).

    Returns:
        One entry per weight record whose weight is an initializer, in record order.
    """
    inits = {init.name: init for init in fp_model.graph.initializer}
    nodes = {node.name: node for node in fp_model.graph.node}
    found = []
    for record in qmodel.records:
        if record.kind is not TensorKind.WEIGHT or record.tensor not in inits:
            continue
        w = tensor_array(inits[record.tensor]).astype(np.float64)
        if w.size == 0:
            continue
        amax = float(np.abs(w).max())
        per_tensor = zeroed_fraction(w, (amax or 1.0) / QMAX)
        node = nodes.get(record.node)
        axis = channel_axis(record.op_type, w.ndim, trans_b(node), record.axis)
        per_channel = zeroed_fraction(w, channel_scale(w, axis)) if w.ndim else per_tensor
        scheme: Literal["per-channel", "per-tensor"] = (
            "per-channel" if len(record.scale) > 1 else "per-tensor")
        found.append(WeightZeroing(record.node, record.op_type, record.tensor, int((w != 0).sum()),
                                   per_tensor, per_channel, scheme))
    return found


def zeroing_evidence(items: Sequence[WeightZeroing]) -> Evidence:
    """The measurements as a table: one row per weight, the percent of its non-zero values zeroed with
    one scale per tensor and per channel (percent, as the findings and the plot say it)."""
    columns = ("node", "op", "non-zero weights", "zeroed per-tensor (%)", "zeroed per-channel (%)", "in use")
    return Evidence(columns, tuple((w.node, w.op_type, w.nonzero, 100.0 * w.per_tensor, 100.0 * w.per_channel,
                                    w.scheme) for w in items))


def check_weight_zeroing(fp_model: onnx.ModelProto, qmodel: QuantizedModel,
                         threshold: float = 0.05) -> CheckOutcome:
    """Flags weights whose range rounds many of them to zero.

    Args:
        fp_model: The FP32 model.
        qmodel: The Q/DQ model and its records.
        threshold: Zeroed share above which a weight is named.

    Returns:
        A ``medium``/``high`` finding for weights zeroed under the scheme the model uses (high
        from 20 %), and an ``info`` finding for weights a per-tensor range would zero while the
        per-channel scales in use keep them.
    """
    items = weight_zeroing(fp_model, qmodel)
    bad = sorted((w for w in items if w.actual > threshold), key=lambda w: -w.actual)
    hidden = sorted((w for w in items if w.actual <= threshold < w.per_tensor), key=lambda w: -w.per_tensor)
    findings = []
    if bad:
        worst = bad[0]
        findings.append(Finding(
            "weight_zeroing", Severity.HIGH if worst.actual >= HIGH_SHARE else Severity.MEDIUM, worst.actual,
            f"{len(bad)} weight(s) lose {100 * worst.actual:.0f}% or less of their non-zero values to 0 in "
            f"INT8 (worst: {worst.node})", tuple(w.node for w in bad),
            zeroing_evidence(bad),
            "Use per-channel weight scales (QuantConfig(per_channel=True)); where per-channel still zeroes "
            "many weights, one outlier weight stretches its channel's range: keep that node in FP16 "
            "(exclude it) or retrain/clip the outlier weights."))
    if hidden:
        worst = hidden[0]
        findings.append(Finding(
            "weight_zeroing", Severity.INFO, worst.per_tensor,
            f"A per-tensor range would zero up to {100 * worst.per_tensor:.0f}% of the weights of "
            f"{len(hidden)} node(s); the per-channel scales in use keep them", tuple(w.node for w in hidden),
            zeroing_evidence(hidden),
            "Keep per-channel weight scales for these nodes; a tool or TensorRT build that forces "
            "per-tensor weights would lose accuracy here."))
    return CheckOutcome(tuple(findings), tuple(items))


def run(ctx: CheckContext) -> CheckOutcome:
    """The doctor's run of this check: the Q/DQ model's weights against the zeroed-share threshold."""
    return check_weight_zeroing(ctx.fp_model, ctx.qmodel, ctx.config.zeroed_fraction)


CHECK = Check("weight_zeroing", run)
