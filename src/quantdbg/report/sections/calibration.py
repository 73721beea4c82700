"""Sections of a calibration: the ranges table, the weights that were folded before placement, and a
calibrator comparison where a result holds one."""
from __future__ import annotations

import math
from collections.abc import Sequence

from quantdbg.calibration import CalibrationResult, CalibratorComparison, TensorStats
from quantdbg.diagnostics.checks.folded_weights import folded_evidence
from quantdbg.model.weights import summarize_folded
from quantdbg.qdq import CalibrationScales
from quantdbg.report.plots import ThresholdHistogram, png, threshold_figure
from quantdbg.report.sections.base import MAX_PANELS, Plot, Section, Table


def clipped_share(stats: TensorStats | None, amax: float) -> float | None:
    """Share of values above ``amax`` (None without statistics or a histogram)."""
    if stats is None or stats.hist is None or stats.hist_range is None or not stats.count:
        return None
    width = stats.hist_range / len(stats.hist)
    first = int(math.floor(amax / width))
    return float(stats.hist[first + 1:].sum()) / stats.count if first + 1 < len(stats.hist) else 0.0


def calibration_sections(result: CalibrationResult) -> list[Section]:
    """What a calibration holds: how much data, one row per tensor (range, scale, statistics), and
    the weights the model held outside plain initializers (one row each: how held, what was done).

    A calibrator comparison is computed by an analysis that asks for it
    (:func:`quantdbg.calibration.compare_calibrators`, the doctor) and shown with that result.
    """
    method = getattr(result.config.method, "__class__", type(None)).__name__
    method = result.config.method if isinstance(result.config.method, str) else method
    nonfinite = [s for s in result.stats.values() if s.nonfinite]
    paragraphs = [f"{len(result.ranges)} activation tensor(s) calibrated on {result.n_samples} sample(s) in "
                  f"{result.n_batches} batch(es); default calibrator {method}."]
    if result.footprint is not None:
        paragraphs.append(f"{result.footprint.describe()}.")
    if nonfinite:
        paragraphs.append(f"{len(nonfinite)} tensor(s) produced NaN/Inf values, left out of the statistics: "
                          + ", ".join(f"{s.name} ({s.nonfinite})" for s in nonfinite[:10]) + ".")
    rows = []
    for name, rng in result.ranges.items():
        stats = result.stats.get(name)
        rows.append((name, rng.method, rng.amax, rng.scale, None if stats is None else stats.min,
                     None if stats is None else stats.max, clipped_share(stats, rng.amax),
                     None if stats is None else stats.nonfinite))
    table = Table(("tensor", "calibrator", "amax", "scale", "min", "max", "clipped share", "non-finite"),
                  tuple(rows), "calibration-ranges")
    tables: tuple[Table, ...] = (table,)
    if result.folded_weights:
        paragraphs.append(f"{summarize_folded(result.folded_weights)}. Each is quantized as a weight, per "
                          "output channel with its own max|w|, and never calibrated as an activation.")
        folded = folded_evidence(result.folded_weights)
        tables += (Table(folded.columns, folded.rows, "folded-weights",
                         "Weights not held in plain initializers"),)
    return [Section("Calibration", tuple(paragraphs), tables)]


def scales_sections(scales: CalibrationScales) -> list[Section]:
    """A scales file: one row per tensor (calibrator, clip, scale); it holds no statistics."""
    methods = sorted({e.method for e in scales.tensors.values() if e.method is not None})
    text = (f"Scales of {len(scales.tensors)} activation tensor(s), as `quantdbg calibrate --scales` wrote "
            f"them (calibrator{'s' if len(methods) != 1 else ''}: {', '.join(methods) or 'not recorded'}). "
            "A scales file holds no statistics: the activation ranges and clipped shares are in a "
            "calibration result's report.")
    rows = tuple((name, e.method, e.amax, e.scale) for name, e in scales.tensors.items())
    return [Section("Calibration scales", (text,),
                    (Table(("tensor", "calibrator", "amax", "scale"), rows, "scale-ranges"),))]


def calibrator_comparison_section(comparisons: Sequence[CalibratorComparison],
                                  title: str = "Calibrators compared") -> Section:
    """Every calibrator's clip per tensor (table) and histograms of the most disputed tensors.

    Args:
        comparisons: What a result holds (e.g. :attr:`quantdbg.diagnostics.DoctorReport.calibrators`).
        title: The section's heading.

    Returns:
        A level-3 section.
    """
    names = sorted({m for c in comparisons for m in c.amax})
    rows = tuple((c.tensor, c.chosen, *(c.amax.get(m) for m in names), c.ratio, c.best,
                  *(c.tensor_sqnr.get(m) for m in names)) for c in comparisons)
    columns = ("tensor", "in use", *(f"amax {m}" for m in names), "max/min", "best",
               *(f"SQNR {m} (dB)" for m in names))
    disputed = sorted(comparisons, key=lambda c: -c.ratio)[:MAX_PANELS]
    items = [ThresholdHistogram(c.tensor, c.hist, c.hist_width, dict(c.amax), c.chosen)
             for c in disputed if c.hist]
    plots = (Plot("|x| histograms with each calibrator's clip (solid: in use)",
                  lambda: png(threshold_figure(items)),
                  "Histograms of " + ", ".join(c.tensor for c in disputed)),) if items else ()
    text = ("Clip (amax) each registered calibrator chooses for each tensor, and the tensor's own SQNR "
            f"after INT8 quantization with that clip. Histograms: the {len(items)} tensor(s) where the "
            "calibrators disagree most.")
    return Section(title, (text,), (Table(columns, rows, "calibrator-comparison"),), plots, level=3)
