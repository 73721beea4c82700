"""Calibrators that disagree: tensors whose calibrators choose clips far apart, and which one is best.

The comparison itself is calibration maths (:func:`quantdbg.calibration.compare_calibrators`); this
check feeds it the consumer layers' SQNR per calibrator from the sensitivity evidence, when the
sensitivity check ran first, and judges the result.
"""
from __future__ import annotations

import glob
import math
import shlex
from dataclasses import replace

from quantdbg.calibration import CalibrationResult, CollectConfig, collect_stats, compare_calibrators
from quantdbg.config import TensorKind
from quantdbg.diagnostics.checks.base import Check, CheckContext, CheckOutcome
from quantdbg.diagnostics.findings import Evidence, Finding, Severity
from quantdbg.sensitivity import SensitivityReport

HIGH_GAIN_DB = 6.0
"""Gain of the best calibrator over the one in use from which the finding is high."""
MEDIUM_GAIN_DB = 1.0
"""... and from which it is medium (below: low); also the gain worth switching calibrators for."""
MATERIAL_GAIN_DB = 3.0
"""Gain of another calibrator over the one in use that makes calibrators disagree whatever their
clips' ratio (half the quantization noise power)."""
SHOWN_SWITCHES = 3
"""Per-tensor calibrator choices spelled out in the fix (the rest are in the evidence)."""


def layer_sqnr(sensitivity: SensitivityReport | None) -> dict[str, dict[str, float]]:
    """Activation tensor -> calibrator -> the worst consumer layer's local SQNR (dB), from the
    sensitivity evidence (empty without a report or evidence)."""
    found: dict[str, dict[str, float]] = {}
    for layer in sensitivity.layers if sensitivity is not None else ():
        if layer.evidence is None or not layer.evidence.calibrator_sqnr:
            continue
        for tensor in dict.fromkeys(i.tensor for i in layer.inputs if i.kind is TensorKind.ACTIVATION):
            per_calibrator = found.setdefault(tensor, {})
            for name, value in layer.evidence.calibrator_sqnr.items():
                per_calibrator[name] = min(per_calibrator.get(name, math.inf), float(value))
    return found


def check_calibrator_disagreement(calibration: CalibrationResult,
                                  sensitivity: SensitivityReport | None = None,
                                  ratio: float = 2.0, min_gain_db: float = MATERIAL_GAIN_DB) -> CheckOutcome:
    """Flags tensors whose calibrators disagree: by more than ``ratio`` in scale, or by at least
    ``min_gain_db`` of SQNR in favour of another calibrator than the one in use.

    Args:
        calibration: Ranges and statistics with histograms.
        sensitivity: A sensitivity report with evidence (optional): the error that decides which
            calibrator is best is then the consumer layer's local output SQNR.
        ratio: Largest / smallest clip above which calibrators disagree.
        min_gain_db: Gain of the best calibrator over the chosen one above which they disagree
            whatever the ratio (clips 1.3x apart can still be 10 dB apart on a ReLU output).

    Returns:
        One finding naming the disagreeing tensors (severity by how much the best calibrator beats
        the chosen one: high from 6 dB, medium from 1 dB, else low); the data holds every tensor's
        comparison.
    """
    items = compare_calibrators(calibration, layer_sqnr(sensitivity))
    bad = sorted((c for c in items if c.ratio > ratio or c.gain_db >= min_gain_db),
                 key=lambda c: (-c.gain_db, -c.ratio))
    if not bad:
        return CheckOutcome((), tuple(items))
    names = sorted({m for c in bad for m in c.amax})
    columns = ("tensor", "chosen", *(f"amax {m}" for m in names), "max/min", "best", "gain (dB)")
    rows = tuple((c.tensor, c.chosen, *(c.amax.get(m) for m in names), c.ratio, c.best, c.gain_db)
                 for c in bad)
    gain = max(c.gain_db for c in bad)
    severity = (Severity.HIGH if gain >= HIGH_GAIN_DB else Severity.MEDIUM if gain >= MEDIUM_GAIN_DB
                else Severity.LOW)
    measure = ("its consumer layer's local output SQNR" if any(c.layer_sqnr for c in bad)
               else "the tensor's own quantization SQNR")
    switch = [c for c in bad if c.best != c.chosen and c.gain_db >= MEDIUM_GAIN_DB]
    # per_tensor keys are globs: a name with glob characters must match only itself.
    entries = ", ".join(f"{glob.escape(c.tensor)!r}: {c.best!r}" for c in switch[:SHOWN_SWITCHES])
    more = "" if len(switch) <= SHOWN_SWITCHES else \
        f", ... ({len(switch) - SHOWN_SWITCHES} more in the evidence)"
    flags = " ".join(shlex.quote(f"{glob.escape(c.tensor)}={c.best}") for c in switch[:SHOWN_SWITCHES])
    fix = (f"Pick the calibrator per tensor: CalibConfig(per_tensor={{{entries}{more}}}) "
           f"(CLI: --per-tensor {flags})." if switch
           else "The calibrator in use is already the best (or within 1 dB) by " + measure + ".")
    finding = Finding(
        "calibrator_disagreement", severity, gain,
        f"Calibrators disagree (clips over {ratio:g}x apart, or {min_gain_db:g} dB or more between "
        f"them) on {len(bad)} tensor(s); the best by {measure} "
        f"beats the one in use by up to {gain:.1f} dB", tuple(c.tensor for c in bad),
        Evidence(columns, rows), fix)
    return CheckOutcome((finding,), tuple(items))


def _with_histograms(ctx: CheckContext) -> CalibrationResult:
    """The calibration, its statistics completed with histograms where its calibrators needed none
    (minmax collects none; every other calibrator needs one)."""
    calibration = ctx.calibration
    missing = [t for t, s in calibration.stats.items() if s.hist is None]
    if not missing:
        return calibration
    stats = dict(calibration.stats)
    stats.update(collect_stats(ctx.fp_model, ctx.calib, missing,
                               CollectConfig(histogram=True, num_bins=ctx.config.calib.num_bins)))
    return replace(calibration, stats=stats)


def run(ctx: CheckContext) -> CheckOutcome:
    """The doctor's run: every calibrator on the calibration's histograms, judged by the layer SQNR
    of the sensitivity evidence when the sensitivity check ran."""
    return check_calibrator_disagreement(_with_histograms(ctx), ctx.sensitivity,
                                         ctx.config.disagreement_ratio, ctx.config.disagreement_gain_db)


CHECK = Check("calibrator_disagreement", run)
