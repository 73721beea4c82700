"""The INT8 repairs tried before any layer leaves INT8: each a pass with a frozen config and an ``apply``.

A pass looks at a :class:`~quantdbg.pipeline.context.Stage` and proposes a repaired one
(:class:`Proposal`), or says why it does not apply; the flow evaluates the proposal and keeps it only
when the task metric improves.

* :class:`CalibratorRepair`: per activation tensor, the registered calibrator whose range gives
  the layers reading it the best local output SQNR (the sensitivity evidence alone,
  :func:`quantdbg.sensitivity.analyze.analyze_evidence` and :func:`quantdbg.sensitivity.suggest_calibrators`:
  no ranking, which the fallback computes on the model it searches); the ranges are re-derived
  from the stored statistics (:func:`quantdbg.calibration.ranges.recalibrate`), with no pass over the data.
* :class:`SmoothQuantRepair`: SmoothQuant (:func:`quantdbg.calibration.smoothing.apply_smoothing`) on the
  MatMul/Gemm nodes whose activation carries outlier channels (one pass measures the per-channel
  ranges, one calibrates the smoothed model).
* :class:`EqualizeRepair`: cross-layer equalization (:func:`quantdbg.calibration.equalize`) of
  consecutive Conv/Gemm layers, then one calibration pass of the equalized model
  (``CalibConfig.equalize``).
* :class:`BiasCorrectionRepair`: the mean shift INT8 weight rounding adds to each output channel,
  taken out of the biases (:func:`quantdbg.calibration.correct_biases`, one pass;
  ``CalibConfig.bias_correction``).

The calibrator choice is also offered as the INT8 start, before the first evaluation
(:meth:`CalibratorRepair.as_start`, behind an output-SQNR gate of its own); when that start then misses
the target, the calibrator repair evaluates the default calibration back
(:meth:`CalibratorRepair.back_to_default`), so a gate that mispredicts costs one evaluation and never
the better calibration.

Equalization and bias correction are recorded as the calibration config's flags, so the recipe's
``calib`` re-applies them. Both are gated: the repaired model is evaluated only when its outputs on
the first samples of the evaluation data are closer to FP32 (a higher SQNR) than the current
model's; a repair that brings them no closer is recorded as not applied, with the two SQNRs, and
costs no task-metric evaluation. On the zoo, equalization lowered the MobileNet-like classifier's
output SQNR (its ReLU6 ceilings rescaled per channel widen the per-tensor activation ranges, and with
per-channel weight scales the first layer's weights gain nothing), and bias correction changed
no task metric.
"""
from __future__ import annotations

import glob
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Generic, Protocol, TypeVar

import numpy as np

from quantdbg.calibration import SmoothingConfig, equalize
from quantdbg.calibration.ranges import recalibrate
from quantdbg.calibration.smoothing.apply import apply_smoothing, smoothing_targets
from quantdbg.calibration.smoothing.result import Migration
from quantdbg.config import CalibConfig, CalibratorSpec, TensorKind
from quantdbg.model import LoadedModel
from quantdbg.model.load import as_loaded
from quantdbg.pipeline.config import (
    AutoConfig,
    BiasCorrectionRepairConfig,
    CalibratorRepairConfig,
    EqualizeRepairConfig,
    Repair,
    SmoothQuantRepairConfig,
)
from quantdbg.pipeline.context import AutoContext, Stage
from quantdbg.pipeline.records import ChannelRange, RepairRecord, SmoothingStep, TensorChoice
from quantdbg.sensitivity import suggest_calibrators
from quantdbg.sensitivity.report import EvidenceReport


@dataclass(frozen=True)
class Proposal:
    """What a repair pass proposes.

    Attributes:
        repair: The pass.
        stage: The repaired stage to evaluate (None: the repair does not apply).
        reason: Why it does not apply, or what it changes.
        calibrators: Calibrator choice: every activation tensor's choice.
        smoothing: SmoothQuant: what was smoothed (or measured, when it does not apply).
        output_sqnr: The gate's output SQNR (dB) before and with the repair (None: no gate ran).
    """

    repair: Repair
    stage: Stage | None
    reason: str
    calibrators: tuple[TensorChoice, ...] = ()
    smoothing: SmoothingStep | None = None
    output_sqnr: tuple[float, float] | None = None

    def record(self, before: float, after: float | None = None, kept: bool = False) -> RepairRecord:
        """The record of this proposal once evaluated (``after`` None: it did not apply)."""
        if after is None:
            reason = self.reason
        else:
            verdict = "kept" if kept else "not kept"
            reason = f"{self.reason}; task metric {before:.6g} -> {after:.6g}: {verdict}"
        return RepairRecord(self.repair, after is not None, kept, before, after, reason, self.calibrators,
                            self.smoothing, self.output_sqnr)

    def start_record(self, value: float) -> RepairRecord:
        """The record of this proposal as the INT8 start, whose task metric is ``value`` (kept; nothing
        before it was evaluated)."""
        return RepairRecord(self.repair, True, True, value, value, self.reason, self.calibrators,
                            self.smoothing, self.output_sqnr, at_start=True)


class RepairPass(Protocol):
    """One INT8 repair."""

    name: Repair
    min_improvement: float

    def apply(self, stage: Stage, context: AutoContext) -> Proposal:
        """The repaired stage proposed for ``stage``, or why the repair does not apply."""
        ...


class _KeepRule(Protocol):
    @property
    def min_improvement(self) -> float: ...


SettingsT = TypeVar("SettingsT", bound=_KeepRule)


class _Pass(Generic[SettingsT]):
    """A repair pass: its settings, the improvement it must bring to be kept, and its one ``apply``.

    Args:
        config: Its settings.
    """

    name: Repair

    def __init__(self, config: SettingsT) -> None:
        self.config = config
        self.min_improvement = config.min_improvement

    def apply(self, stage: Stage, context: AutoContext) -> Proposal:
        """The repaired stage proposed for ``stage``, or why the repair does not apply.

        Args:
            stage: The model to repair.
            context: Runs the stored passes the repair needs (evidence, calibration, measurements).

        Returns:
            The proposal; no stage when the repair does not apply (or its gate says it brings the
            outputs no closer to FP32).

        Raises:
            ModelError: SmoothQuant: a ``smoothing.nodes``/``exclude`` glob matches no node.
        """
        return self._checked(self._propose(stage, context), stage, context)

    def _propose(self, stage: Stage, context: AutoContext) -> Proposal:
        raise NotImplementedError

    def _checked(self, proposal: Proposal, stage: Stage, context: AutoContext) -> Proposal:
        """The proposal to evaluate (ungated passes: as proposed)."""
        return proposal


class _Gate(_Pass[EqualizeRepairConfig | BiasCorrectionRepairConfig]):
    """A pass whose repaired model is evaluated only when its outputs are closer to FP32."""

    def _checked(self, proposal: Proposal, stage: Stage, context: AutoContext) -> Proposal:
        return gated(proposal, stage, context, self.config.min_sqnr_gain, self.config.gate_samples)


def gated(proposal: Proposal, stage: Stage, context: AutoContext, gain: float | None,
          samples: int) -> Proposal:
    """``proposal`` when its outputs' SQNR against FP32 on the first ``samples`` samples beats ``stage``'s by
    more than ``gain`` dB (None: no gate); else the same without its stage (not evaluated), saying why.

    Args:
        proposal: A repair's proposal for ``stage``.
        stage: The model it repairs.
        context: Measures the output SQNRs (stored passes).
        gain: The gain needed (dB).
        samples: Samples the outputs are compared on.

    Returns:
        The proposal, its reason and ``output_sqnr`` saying what was measured.
    """
    if gain is None or proposal.stage is None:
        return proposal
    before, after = context.output_sqnr(stage, samples), context.output_sqnr(proposal.stage, samples)
    measured = f"output SQNR against FP32 on the first {samples} samples {before:.3g} -> {after:.3g} dB"
    if after - before > gain:
        return replace(proposal, reason=f"{proposal.reason}; {measured}", output_sqnr=(before, after))
    need = "a gain" if gain == 0 else f"a gain above {gain:g} dB"
    return replace(proposal, stage=None, output_sqnr=(before, after),
                   reason=f"{proposal.reason}; not evaluated: {measured}, {need} is needed")


def with_per_tensor(config: CalibConfig, choices: Mapping[str, CalibratorSpec]) -> CalibConfig:
    """``config`` with exact per-tensor choices put first, so they win over its own globs.

    Args:
        config: A calibration config.
        choices: Tensor name (not a glob) -> calibrator.

    Returns:
        The new config.
    """
    exact = {glob.escape(tensor): spec for tensor, spec in choices.items()}
    kept = {pattern: spec for pattern, spec in config.per_tensor.items() if pattern not in exact}
    return replace(config, per_tensor={**exact, **kept})


class CalibratorRepair(_Pass[CalibratorRepairConfig]):
    """Per-tensor calibrator choice from the sensitivity evidence."""

    name: Repair = "calibrator"

    def as_start(self, stage: Stage, context: AutoContext) -> Proposal:
        """The choice proposed as the INT8 start instead of ``stage`` (the default calibration), before
        any task-metric evaluation: no stage unless its outputs beat ``stage``'s by more than
        ``start_sqnr_gain`` (or when every tensor has its best calibrator already).

        Args:
            stage: The default INT8 stage.
            context: Runs the stored passes (evidence, output SQNRs).

        Returns:
            The proposal; its reason says what the start gate measured.
        """
        if self.config.start_sqnr_gain is None:
            return Proposal(self.name, None, "the start gate is off (start_sqnr_gain None)")
        proposal = gated(self.apply(stage, context), stage, context, self.config.start_sqnr_gain,
                         self.config.gate_samples)
        if proposal.stage is None:
            return proposal
        return replace(proposal, reason=f"chosen as the INT8 start before any evaluation (the default "
                                        f"calibration was not evaluated): {proposal.reason}")

    def back_to_default(self, stage: Stage, context: AutoContext) -> Proposal:
        """``stage`` with the flow's default calibration back (its ``per_tensor`` choices), once the choice
        made the INT8 start and the target was missed: the start gate only predicted the choice was
        better, and the default is the one calibration left to try (no pass over the data).

        Args:
            stage: The stage the INT8 start led to.
            context: Holds the flow's default calibration config.

        Returns:
            The proposal to evaluate.
        """
        config = replace(stage.calib_config, per_tensor=context.config.calib.per_tensor)
        default = context.recalibrated(stage, config, recalibrate(stage.calibration, config, stage.plan))
        return Proposal(self.name, default, "the default calibration back, instead of the calibrator choice "
                        "the INT8 start took")

    def _propose(self, stage: Stage, context: AutoContext) -> Proposal:
        """``stage`` with each tensor's best calibrator, the ranges re-derived from its statistics (it holds
        histograms for every tensor); the evidence is a stored pass (the calibrator comparison alone, no
        ranking). No stage when every tensor already has its best calibrator."""
        report = context.evidence(stage)
        suggested = suggest_calibrators(report, only_changes=False)
        # suggest_calibrators names each tensor by its exact-match glob
        best = {t: suggested[glob.escape(t)] for t in stage.plan.activation_tensors
                if glob.escape(t) in suggested}
        previous = {t: stage.calibration.ranges[t].method for t in best}
        changes = {t: name for t, name in best.items() if name != previous[t]}
        if not changes:
            choices = _choices(report, stage, stage, best)
            return Proposal(self.name, None, f"each of the {len(best)} activation tensor(s) with evidence "
                            "already has the calibrator with the best local output SQNR", choices)
        config = with_per_tensor(stage.calib_config, changes)
        repaired = context.recalibrated(stage, config, recalibrate(stage.calibration, config, stage.plan))
        choices = _choices(report, stage, repaired, best)
        shown = ", ".join(f"{t} {previous[t]} -> {name}" for t, name in list(changes.items())[:3])
        more = f" and {len(changes) - 3} more" if len(changes) > 3 else ""
        return Proposal(self.name, repaired, f"{len(changes)} of {len(best)} activation tensor(s) change "
                        f"calibrator ({shown}{more})", choices)


def _worst_sqnr(report: EvidenceReport) -> Callable[[str, str], float | None]:
    """(tensor, calibrator) -> the worst local output SQNR of the layers reading the tensor with it."""
    found: dict[tuple[str, str], float] = {}
    for layer in report.layers:
        sqnr = layer.evidence.calibrator_sqnr if layer.evidence is not None else None
        for inp in layer.inputs:
            if inp.kind is not TensorKind.ACTIVATION or not sqnr:
                continue
            for name, value in sqnr.items():
                key = (inp.tensor, name)
                found[key] = min(found.get(key, value), value)
    return lambda tensor, name: found.get((tensor, name))


def _choices(report: EvidenceReport, before: Stage, after: Stage,
             best: Mapping[str, str]) -> tuple[TensorChoice, ...]:
    sqnr = _worst_sqnr(report)
    found = []
    for tensor, name in best.items():
        old = before.calibration.ranges[tensor]
        found.append(TensorChoice(tensor, old.method, name, old.amax, after.calibration.ranges[tensor].amax,
                                  sqnr(tensor, old.method), sqnr(tensor, name)))
    return tuple(found)


class SmoothQuantRepair(_Pass[SmoothQuantRepairConfig]):
    """SmoothQuant on the MatMul/Gemm nodes whose activation carries outlier channels."""

    name: Repair = "smoothquant"

    def _propose(self, stage: Stage, context: AutoContext) -> Proposal:
        """``stage``'s FP32 model smoothed where activations carry outlier channels, recalibrated (the
        per-channel ranges and the calibration are stored passes). No stage when no MatMul/Gemm reads an
        activation with outlier channels."""
        base = self.config.smoothing
        tensors = smoothing_targets(stage.fp, base)
        if not tensors:
            return Proposal(self.name, None, f"no {'/'.join(base.op_types)} node reads an activation with an "
                            "initializer weight")
        ranges = context.channel_absmax(stage.fp, tensors)
        ratio = {r.tensor: r.outlier_ratio for r in ranges}
        chosen = [r for r in ranges if r.outlier_ratio >= self.config.min_outlier_ratio]
        if not chosen:
            peak = max(ratio, key=ratio.__getitem__)
            return Proposal(self.name, None, f"no activation read by a {'/'.join(base.op_types)} node has "
                            f"outlier channels (largest channel max|x| / median channel: {ratio[peak]:.3g} "
                            f"for {peak!r}, below {self.config.min_outlier_ratio:g})",
                            smoothing=SmoothingStep(base, (), (), ratio))
        config = replace(base, nodes=tuple(glob.escape(n) for n in _readers(stage.fp, chosen, base)))
        result = apply_smoothing(stage.fp, {r.tensor: r.absmax for r in chosen}, config)
        step = SmoothingStep(config, tuple(chosen), result.migrations, ratio)
        calib = _carry_choices(stage, result.migrations)
        repaired = context.stage(as_loaded(result.model), calib, step)
        top = max(chosen, key=lambda r: r.outlier_ratio)
        return Proposal(self.name, repaired, f"smoothed {len(result.nodes)} node(s) reading {len(chosen)} "
                        f"activation(s) with outlier channels (largest ratio {top.outlier_ratio:.3g} for "
                        f"{top.tensor!r}, alpha {config.alpha:g})", smoothing=step)


def _readers(fp: LoadedModel, chosen: Sequence[ChannelRange], config: SmoothingConfig) -> list[str]:
    """The selected nodes of ``config``'s op types reading one of the ``chosen`` activations."""
    tensors = {r.tensor for r in chosen}
    return [n.name for n in fp.proto.graph.node
            if n.op_type in config.op_types and n.input and n.input[0] in tensors and config.selects(n.name)]


def _carry_choices(stage: Stage, migrations: Sequence[Migration]) -> CalibConfig:
    """The stage's calibrator choice, with each activation that smoothing replaced by an inserted Mul's
    output keeping the calibrator it had."""
    config = stage.calib_config
    moved: dict[str, CalibratorSpec] = {}
    for m in migrations:
        tensor, smoothed = m.tensor, m.smoothed_tensor
        ops = stage.plan.consumer_ops(tensor)
        spec = config.method_for(tensor, ops)
        if smoothed != tensor and spec != config.method_for(smoothed, ops):
            moved[smoothed] = spec
    return with_per_tensor(config, moved) if moved else config


class EqualizeRepair(_Gate):
    """Cross-layer equalization of consecutive Conv/Gemm layers, then a calibration of the equalized model."""

    name: Repair = "equalize"

    def _propose(self, stage: Stage, context: AutoContext) -> Proposal:
        """``stage``'s FP32 model equalized and calibrated again (a stored pass). No stage when no pair of
        layers needs rescaling."""
        if stage.calib_config.equalize:
            return Proposal(self.name, None, "the model is equalized already")
        found = equalize(stage.fp)
        pairs = found.equalization.pairs
        if not pairs:
            return Proposal(self.name, None, "no pair of Conv/Gemm layers (through Relu, LeakyRelu, pooling "
                            "or nothing) has channels to balance")
        repaired = context.stage(found.model, replace(stage.calib_config, equalize=True), stage.smoothing)
        worst = max(pairs, key=lambda p: p.imbalance_before)
        return Proposal(self.name, repaired, f"equalized {len(pairs)} pair(s) of layers (most unbalanced: "
                        f"{worst.first} -> {worst.second}, largest over smallest channel range ratio "
                        f"{worst.imbalance_before:.3g} -> {worst.imbalance_after:.3g})")


class BiasCorrectionRepair(_Gate):
    """The mean shift INT8 weight rounding adds to each output channel, taken out of the biases."""

    name: Repair = "bias_correction"

    def _propose(self, stage: Stage, context: AutoContext) -> Proposal:
        """``stage`` with its biases corrected (one stored pass measures the corrections). No stage when no
        quantized layer's bias can be corrected."""
        if stage.calibration.bias_correction is not None:
            return Proposal(self.name, None, "the biases are corrected already")
        repaired = context.bias_corrected(stage)
        found = repaired.calibration.bias_correction
        assert found is not None  # bias_corrected() measures them
        skipped = f"; {len(found.skipped)} skipped ({found.skipped[0].reason})" if found.skipped else ""
        if not found.corrections:
            return Proposal(self.name, None, f"no quantized layer's bias can be corrected{skipped}")
        top = max(found.corrections, key=lambda c: float(np.abs(c.shift).max()))
        return Proposal(self.name, repaired, f"corrected the biases of {len(found.corrections)} layer(s) "
                        f"(largest mean shift {float(np.abs(top.shift).max()):.3g} in {top.node}){skipped}")


REPAIR_PASSES: Mapping[Repair, Callable[[AutoConfig], RepairPass]] = MappingProxyType({
    "equalize": lambda config: EqualizeRepair(config.equalize),
    "bias_correction": lambda config: BiasCorrectionRepair(config.bias_correction),
    "calibrator": lambda config: CalibratorRepair(config.calibrator),
    "smoothquant": lambda config: SmoothQuantRepair(config.smoothquant),
})
"""Repair name -> builds its pass from the flow's settings."""


__all__ = ["REPAIR_PASSES", "BiasCorrectionRepair", "CalibratorRepair", "EqualizeRepair", "Proposal",
           "RepairPass", "SmoothQuantRepair", "gated", "with_per_tensor"]
