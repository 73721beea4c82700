"""One tensor mixing value ranges: channels one per-tensor scale zeroes while the tensor's SQNR looks fine.

A detection head's boxes (hundreds) next to its scores (below one), or a transformer's few outlier
channels: one scale set by the large channels rounds most values of the small ones to 0, yet the
whole tensor's SQNR stays high because the large channels dominate its energy.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import onnx

from quantdbg._json import Serializable
from quantdbg.backends import OnnxrtRunner, OrtConfig
from quantdbg.calibration import collect_stats
from quantdbg.calibration.collect import expose_tensors
from quantdbg.diagnostics.checks.base import Check, CheckContext, CheckOutcome
from quantdbg.diagnostics.findings import Evidence, Finding, Severity
from quantdbg.model.specs import input_specs
from quantdbg.quant_math import QMAX, sqnr_db

MIN_ALIVE = 0.1
"""A channel is examined for zeroing only when at least this share of its values is significant
(``|x| >= SIGNIFICANT * amax``): mostly-zero channels after a Relu, or dead ones, lose nothing."""
SIGNIFICANT = 1e-4
MIXED_RATIO = 16.0
"""A swamped channel's max|x| is at most the largest channel's / this: its range differs from the
tensor's by 4 bits or more (a Softmax's channels all reach ~1 and mix nothing)."""
SHOWN_CHANNELS = 16
"""Swamped channels listed in a finding's evidence."""

Role = Literal["output", "quantized"]


@dataclass(frozen=True)
class MixedRange(Serializable):
    """Per-channel view of one tensor under a single per-tensor scale.

    Attributes:
        tensor: ONNX value name.
        role: ``"output"`` (a graph output) or ``"quantized"`` (an activation with a Q/DQ pair).
        axis: The channel axis examined.
        scale: The single scale (the calibrated one, or max|x| / 127 for an output).
        channel_absmax: max|x| per channel.
        channel_zeroed: Share of each channel's non-zero values that round to 0 with ``scale``.
        swamped: Channels carrying significant values whose max|x| is at most 1/16 of the largest
            channel's, and where more than the threshold of non-zero values round to 0.
        sqnr_db: SQNR of the whole tensor quantized with ``scale``.
        swamped_sqnr_db: SQNR of the swamped channels alone (nan when none).
    """

    tensor: str
    role: Role
    axis: int
    scale: float
    channel_absmax: tuple[float, ...]
    channel_zeroed: tuple[float, ...]
    swamped: tuple[int, ...]
    sqnr_db: float
    swamped_sqnr_db: float


_SUMS = ("absmax", "count", "nonzero", "significant", "zeroed", "signal", "noise")


class _ChannelSums:
    """Streaming per-channel sums for one (tensor, axis) under one scale."""

    def __init__(self, scale: float) -> None:
        self.scale = scale
        self.sums: dict[str, np.ndarray] = {}

    def update(self, x: np.ndarray, axis: int) -> None:
        moved = np.moveaxis(np.asarray(x, np.float64), axis, 0).reshape(x.shape[axis], -1)
        q = np.clip(np.round(moved / self.scale), -QMAX - 1, QMAX) * self.scale
        nz = moved != 0
        batch = {"absmax": np.abs(moved).max(axis=1), "count": np.full(moved.shape[0], moved.shape[1]),
                 "nonzero": nz.sum(axis=1),
                 "significant": (np.abs(moved) >= SIGNIFICANT * QMAX * self.scale).sum(axis=1),
                 "zeroed": (nz & (q == 0)).sum(axis=1), "signal": (moved ** 2).sum(axis=1),
                 "noise": ((moved - q) ** 2).sum(axis=1)}
        for name, value in batch.items():
            old = self.sums.get(name)
            if old is not None:
                value = np.maximum(old, value) if name == "absmax" else old + value
            self.sums[name] = value

    def entry(self, tensor: str, role: Role, axis: int, threshold: float) -> MixedRange:
        """The measurement of this (tensor, axis): which channels the scale swamps."""
        absmax, count, nonzero, significant, zeroed_n, signal, noise = (self.sums[k] for k in _SUMS)
        zeroed = np.where(nonzero > 0, zeroed_n / np.maximum(nonzero, 1), 0.0)
        alive = significant >= MIN_ALIVE * count
        small = absmax <= absmax.max(initial=0.0) / MIXED_RATIO
        swamped = np.flatnonzero((zeroed > threshold) & alive & small)
        swamped_sqnr = sqnr_db(float(signal[swamped].sum()), float(noise[swamped].sum())) \
            if swamped.size else math.nan
        return MixedRange(tensor, role, axis, self.scale, tuple(float(v) for v in absmax),
                          tuple(float(v) for v in zeroed), tuple(int(c) for c in swamped),
                          sqnr_db(float(signal.sum()), float(noise.sum())), swamped_sqnr)


def _candidate_axes(rank: int) -> list[int]:
    if rank < 2:
        return []
    return sorted({1, rank - 1})


def _roles_and_scales(model: onnx.ModelProto, data: Iterable[Mapping[str, np.ndarray]],
                      scales: Mapping[str, float], outputs: Sequence[str]
                      ) -> tuple[dict[str, Role], dict[str, float]]:
    """Each examined tensor's role, and its scale (max|x| / 127 for an output without one)."""
    all_scales = dict(scales)
    pending = [o for o in outputs if o not in all_scales]
    if pending:
        stats = collect_stats(model, data, pending)
        all_scales.update({o: (stats[o].absmax or 1.0) / QMAX for o in pending})
    roles: dict[str, Role] = {t: "quantized" for t in scales}
    roles.update({o: "output" for o in outputs})
    return roles, all_scales


def mixed_ranges(model: onnx.ModelProto, data: Iterable[Mapping[str, np.ndarray]],
                 scales: Mapping[str, float], outputs: Sequence[str], threshold: float = 0.5,
                 threads: int = 0) -> list[MixedRange]:
    """Measures, per channel, what one per-tensor scale does to each tensor.

    Args:
        model: A loaded FP32 model.
        data: Feeds (iterated twice when ``outputs`` need their max|x| first).
        scales: Quantized activation tensor -> its scale.
        outputs: Graph outputs to examine with the scale ``max|x| / 127``.
        threshold: Share of a channel's non-zero values rounding to 0 that makes it swamped.
        threads: ONNX Runtime intra-op threads.

    Returns:
        One entry per (tensor, channel axis) examined; for each tensor the axis with the most
        swamped channels comes first.
    """
    specs = input_specs(model)
    roles, all_scales = _roles_and_scales(model, data, scales, outputs)
    sums: dict[tuple[str, int], _ChannelSums] = {}
    fetch = [t for t in roles if t not in specs]
    with OnnxrtRunner(expose_tensors(model, fetch), OrtConfig(intra_op_num_threads=threads)) as runner:
        for feed in data:
            values = runner.infer(feed, fetch) if fetch else {}
            values.update({t: np.asarray(feed[t]) for t in roles if t in feed})
            for tensor in roles:
                x = values[tensor]
                if not np.issubdtype(x.dtype, np.floating):
                    continue
                for axis in _candidate_axes(x.ndim):
                    sums.setdefault((tensor, axis), _ChannelSums(all_scales[tensor])).update(x, axis)
    found = [s.entry(t, roles[t], axis, threshold) for (t, axis), s in sums.items()]
    return sorted(found, key=lambda m: (list(roles).index(m.tensor), -len(m.swamped), m.axis))


def _finding(item: MixedRange) -> Finding:
    big = max(item.channel_absmax)
    small = max(item.channel_absmax[c] for c in item.swamped)
    rows = tuple((c, item.channel_absmax[c], item.channel_zeroed[c]) for c in item.swamped[:SHOWN_CHANNELS])
    where = "graph output" if item.role == "output" else "quantized tensor"
    return Finding(
        "mixed_ranges", Severity.HIGH if item.role == "output" else Severity.MEDIUM,
        float(len(item.swamped)) / max(len(item.channel_absmax), 1),
        f"{where} {item.tensor} mixes value ranges on axis {item.axis}: one scale ({item.scale:.3g}) "
        f"zeroes most values of {len(item.swamped)} of {len(item.channel_absmax)} channels (max |x| "
        f"{small:.3g} vs {big:.3g}) while its SQNR is {item.sqnr_db:.1f} dB (those channels alone: "
        f"{item.swamped_sqnr_db:.1f} dB)", (item.tensor,),
        Evidence(("channel", "max |x|", "zeroed share"), rows),
        "Do not judge this tensor by SQNR: score the model with a task metric. Keep it out of INT8 "
        "(exclude its consumers) or split it so each value range gets its own scale.")


def check_mixed_ranges(items: Sequence[MixedRange], min_sqnr_db: float = 25.0) -> CheckOutcome:
    """Flags tensors where one scale zeroes whole channels while the tensor's SQNR looks fine.

    Args:
        items: Measurements from :func:`mixed_ranges`.
        min_sqnr_db: Whole-tensor SQNR at or above which the damage is hidden.

    Returns:
        One finding per affected tensor (high for a graph output, medium for a quantized tensor).
    """
    findings = []
    seen: set[str] = set()
    for item in items:
        if item.tensor in seen or not item.swamped or item.sqnr_db < min_sqnr_db:
            continue
        seen.add(item.tensor)
        findings.append(_finding(item))
    return CheckOutcome(tuple(findings), tuple(items))


def run(ctx: CheckContext) -> CheckOutcome:
    """The doctor's run: every quantized activation with its calibrated scale, and every graph output."""
    scales = {t: r.scale for t, r in ctx.calibration.ranges.items()}
    outputs = [o.name for o in ctx.fp_model.graph.output]
    items = mixed_ranges(ctx.fp_model, ctx.calib, scales, outputs, ctx.config.swamped_fraction,
                         ctx.config.threads)
    return check_mixed_ranges(items, ctx.config.hidden_sqnr_db)


CHECK = Check("mixed_ranges", run)
