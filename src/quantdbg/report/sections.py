"""What a report says about each kind of result, as format-neutral sections.

A :class:`Section` holds paragraphs, tables of raw values and plots that are drawn only when an
HTML report asks for them; :mod:`quantdbg.report` turns sections into HTML, Markdown or a
DataFrame. One builder per result kind lives here.
"""
from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from quantdbg.config import TensorKind
from quantdbg.diagnostics import Cell

if TYPE_CHECKING:
    from quantdbg.calibration import CalibrationResult
    from quantdbg.diagnostics import DoctorReport, LintReport
    from quantdbg.fallback import FallbackPlan
    from quantdbg.sensitivity import SensitivityReport

MAX_ROWS = 200
"""Rows shown per table; the JSON and the DataFrame keep every row."""
MAX_PANELS = 8
"""Histogram panels drawn per report."""
MAX_BARS = 30
"""Layers drawn in a ranking chart."""


@dataclass(frozen=True)
class Table:
    """A table of raw values (formatted only when rendered).

    Attributes:
        columns: Column headers.
        rows: Rows of cells.
        css_id: HTML id (e.g. ``"sensitivity-ranking"``); also marks the table a DataFrame is made from.
        caption: One line above the table.
    """

    columns: tuple[str, ...]
    rows: tuple[tuple[Cell, ...], ...]
    css_id: str = ""
    caption: str = ""


@dataclass(frozen=True)
class Plot:
    """A figure drawn on demand.

    Attributes:
        title: Caption.
        draw: Returns PNG bytes (needs matplotlib).
        alt: Text alternative.
    """

    title: str
    draw: Callable[[], bytes]
    alt: str


@dataclass(frozen=True)
class Section:
    """One part of a report.

    Attributes:
        title: Heading.
        paragraphs: Plain-text paragraphs.
        tables: Tables, in order.
        plots: Plots, in order (after the paragraphs, before the tables).
        code: Preformatted lines (commands).
        level: Heading level (2 for a result, 3 for its parts).
    """

    title: str
    paragraphs: tuple[str, ...] = ()
    tables: tuple[Table, ...] = ()
    plots: tuple[Plot, ...] = ()
    code: tuple[str, ...] = ()
    level: int = 2

    @property
    def anchor(self) -> str:
        """A URL fragment made from the title."""
        return re.sub(r"[^a-z0-9]+", "-", self.title.lower()).strip("-") or "section"


def _plots_module() -> Any:
    from quantdbg.report import plots as report_plots

    return report_plots


def _fmt(value: float | None, spec: str = ".4g") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    return format(value, spec)


# --------------------------------------------------------------------------------------------
# Calibration
# --------------------------------------------------------------------------------------------

def _clipped(stats: Any, amax: float) -> float | None:
    """Share of values above ``amax`` (None without a histogram)."""
    if stats is None or stats.hist is None or not stats.count:
        return None
    width = stats.hist_range / len(stats.hist)
    first = int(math.floor(amax / width))
    return float(stats.hist[first + 1:].sum()) / stats.count if first + 1 < len(stats.hist) else 0.0


def calibration_sections(result: CalibrationResult) -> list[Section]:
    """Ranges table, and every calibrator's clip drawn on the histograms where they disagree most."""
    from quantdbg.diagnostics import compare_calibrators

    method = getattr(result.config.method, "__class__", type(None)).__name__
    method = result.config.method if isinstance(result.config.method, str) else method
    nonfinite = [s for s in result.stats.values() if s.nonfinite]
    paragraphs = [f"{len(result.ranges)} activation tensor(s) calibrated on {result.n_samples} sample(s) in "
                  f"{result.n_batches} batch(es); default calibrator {method}."]
    if nonfinite:
        paragraphs.append(f"{len(nonfinite)} tensor(s) produced NaN/Inf values, left out of the statistics: "
                          + ", ".join(f"{s.name} ({s.nonfinite})" for s in nonfinite[:10]) + ".")
    rows = []
    for name, rng in result.ranges.items():
        stats = result.stats.get(name)
        rows.append((name, rng.method, rng.amax, rng.scale, None if stats is None else stats.min,
                     None if stats is None else stats.max, _clipped(stats, rng.amax),
                     None if stats is None else stats.nonfinite))
    table = Table(("tensor", "calibrator", "amax", "scale", "min", "max", "clipped share", "non-finite"),
                  tuple(rows), "calibration-ranges")
    sections = [Section("Calibration", tuple(paragraphs), (table,))]
    comparisons = compare_calibrators(result)
    if comparisons:
        sections.append(calibrator_comparison_section(comparisons))
    return sections


def calibrator_comparison_section(comparisons: Sequence[Any], title: str = "Calibrators compared") -> Section:
    """Every calibrator's clip per tensor (table) and histograms of the most disputed tensors."""
    names = sorted({m for c in comparisons for m in c.amax})
    rows = tuple((c.tensor, c.chosen, *(c.amax.get(m) for m in names), c.ratio, c.best,
                  *(c.tensor_sqnr.get(m) for m in names)) for c in comparisons)
    columns = ("tensor", "in use", *(f"amax {m}" for m in names), "max/min", "best",
               *(f"SQNR {m} (dB)" for m in names))
    disputed = sorted(comparisons, key=lambda c: -c.ratio)[:MAX_PANELS]
    items = [_plots_module().ThresholdHistogram(c.tensor, c.hist, c.hist_width, dict(c.amax), c.chosen)
             for c in disputed if c.hist]
    plots = (Plot("|x| histograms with each calibrator's clip (solid: in use)",
                  lambda: _plots_module().threshold_histograms(items),
                  "Histograms of " + ", ".join(c.tensor for c in disputed)),) if items else ()
    text = ("Clip (amax) each registered calibrator chooses for each tensor, and the tensor's own SQNR "
            f"after INT8 quantization with that clip. Histograms: the {len(items)} tensor(s) where the "
            "calibrators disagree most.")
    return Section(title, (text,), (Table(columns, rows, "calibrator-comparison"),), plots, level=3)


# --------------------------------------------------------------------------------------------
# Sensitivity
# --------------------------------------------------------------------------------------------

def _deficit(values: Sequence[float], higher_is_better: bool) -> list[float]:
    """How far each value is from the best finite one (>= 0; non-finite values draw no bar)."""
    finite = [v for v in values if math.isfinite(v)]
    if not finite:
        return [0.0] * len(values)
    best = max(finite) if higher_is_better else min(finite)
    return [abs(best - v) if math.isfinite(v) else 0.0 for v in values]


def _chart_values(report: SensitivityReport) -> tuple[list[float], str]:
    """What the ranking chart draws per layer (longer bar = more sensitive) and its label."""
    layers = report.layers
    values = [layer.value for layer in layers]
    sign = 1.0 if report.higher_is_better else -1.0
    if report.mode == "local":
        return _deficit(values, True), "noise of the layer's own output above the quietest layer's (dB)"
    if report.mode == "cumulative":
        return [layer.score for layer in layers], "noise-to-signal ratio the layer adds"
    ref = report.reference_value
    if report.mode == "isolated" and ref is not None and math.isfinite(ref):
        return [sign * (ref - v) for v in values], f"{report.metric} lost with only this layer in INT8"
    if report.mode == "isolated":  # e.g. SQNR, whose FP32 reference is infinite
        return (_deficit(values, report.higher_is_better),
                f"{report.metric} with only this layer in INT8, below the least harmful layer's")
    base = report.baseline_value
    if base is not None and math.isfinite(base):
        return ([sign * (v - base) for v in values],
                f"{report.metric} regained by taking only this layer out of INT8")
    return _deficit(values, not report.higher_is_better), f"{report.metric} regained (relative)"


def _evidence_cells(layer: Any) -> tuple[Cell, ...]:
    ev = layer.evidence
    if ev is None:
        return (None, None, None, None)
    return (ev.weight_zero_fraction_per_tensor, ev.weight_zero_fraction, ev.activation_outlier_ratio,
            ev.best_calibrator)


def sensitivity_sections(report: SensitivityReport, highlight: Sequence[str] = ()) -> list[Section]:
    """Ranking chart and table (with the evidence), plus the error along the graph in cumulative mode."""
    values, label = _chart_values(report)
    shown = report.layers[:MAX_BARS]
    names = [layer.node for layer in shown]
    plot = Plot(f"Ranking ({report.mode})",
                lambda: _plots_module().ranking_chart(names, values[:len(names)], label, highlight=highlight),
                "Bar chart of layer sensitivity: " + ", ".join(names[:10]))
    paragraphs = [f"Mode {report.mode}: {report.score_meaning}. {len(report.layers)} quantized layer(s), "
                  f"{report.n_samples} sample(s), {report.n_passes} pass(es), {report.seconds:.1f} s."]
    if report.reference_value is not None or report.baseline_value is not None:
        paragraphs.append(f"{report.metric}: FP32 {_fmt(report.reference_value)}, every layer in INT8 "
                          f"{_fmt(report.baseline_value)}.")
    if report.baseline is not None:
        total = report.baseline.total
        paragraphs.append(f"Fully quantized outputs against FP32: SQNR {_fmt(total.sqnr_db, '.2f')} dB, "
                          f"cosine {_fmt(total.cosine, '.5f')}.")
    rows = tuple((layer.rank, layer.node, layer.op_type, layer.score, layer.value,
                  None if layer.metrics is None else layer.metrics.sqnr_db,
                  ", ".join(sorted({i.calibrator for i in layer.inputs if i.kind is TensorKind.ACTIVATION})),
                  *_evidence_cells(layer)) for layer in report.layers)
    columns = ("rank", "node", "op", "score", "value", "SQNR (dB)", "activation calibrator",
               "weights zeroed per-tensor", "weights zeroed (in use)", "outlier ratio", "best calibrator")
    sections = [Section(f"Sensitivity ranking ({report.mode})", tuple(paragraphs),
                        (Table(columns, rows, "sensitivity-ranking", "Most sensitive first."),), (plot,))]
    if report.tensors:
        sections.append(_cumulative_section(report))
    return sections


def _cumulative_section(report: SensitivityReport) -> Section:
    tensors = report.tensors
    worst = sorted(tensors, key=lambda t: t.metrics.sqnr_db)[:20]
    rows = tuple((t.tensor, t.node, t.op_type, t.metrics.sqnr_db, t.metrics.cosine) for t in worst)
    return Section("Error along the graph", (
        f"{len(tensors)} intermediate tensors of the fully quantized model compared with FP32; the 20 "
        "with the lowest SQNR:",), (Table(("tensor", "node", "op", "SQNR (dB)", "cosine"), rows,
                                           "cumulative-tensors"),), level=3)


# --------------------------------------------------------------------------------------------
# Fallback
# --------------------------------------------------------------------------------------------

def fallback_sections(plan: FallbackPlan) -> list[Section]:
    """The outcome, the layers kept out of INT8, every evaluation (chart and table), build commands."""
    paragraphs = [plan.message or f"Status: {plan.status}.",
                  f"Target: {plan.target.describe()}. Strategy {plan.strategy}: {plan.n_evaluations} "
                  f"evaluation(s) of a budget of {plan.budget}, plus the verification; set is "
                  f"{'1-minimal' if plan.minimal else 'not proven minimal'}; fallback precision "
                  f"{plan.precision.value}."]
    rank = {node: i + 1 for i, node in enumerate(plan.ranking)}
    kept = Table(("node", "rank"), tuple((node, rank.get(node)) for node in plan.nodes), "fallback-nodes",
                 "Layers kept out of INT8.")
    evals = Table(("#", "purpose", "layers out of INT8", "value", "met", "layers"),
                  tuple((i, e.purpose, len(e.nodes), e.value, e.met, ", ".join(e.nodes[:8])
                         + (" ..." if len(e.nodes) > 8 else "")) for i, e in enumerate(plan.evaluations, 1)),
                  "fallback-evaluations")
    sizes = [len(e.nodes) for e in plan.evaluations]
    values = [e.value for e in plan.evaluations]
    met = [e.met for e in plan.evaluations]
    plots = (Plot("Fallback search", lambda: _plots_module().fallback_chart(
        sizes, values, met, plan.target.threshold, plan.target.kind), "Metric of each evaluation"),) \
        if plan.evaluations else ()
    code = (" ".join(plan.tensorrt.trtexec_args()),
            f"modelopt nodes_to_exclude={list(plan.nodes_to_exclude)!r}")
    return [Section("Fallback plan", tuple(paragraphs), (evals, kept), plots, code)]


# --------------------------------------------------------------------------------------------
# Lint
# --------------------------------------------------------------------------------------------

def lint_sections(report: LintReport) -> list[Section]:
    """Counts per severity and one row per finding."""
    counts = report.counts()
    text = (f"TensorRT Q/DQ lint of {report.model or 'the model'}: " + ", ".join(
        f"{n} {s}" for s, n in counts.items()) + ".")
    rows = tuple((f.severity.value, f.rule, f.node, f.message, f.fix) for f in report.findings)
    return [Section("TensorRT Q/DQ lint", (text,),
                    (Table(("severity", "rule", "node", "finding", "fix"), rows, "lint-findings"),))]


# --------------------------------------------------------------------------------------------
# Doctor
# --------------------------------------------------------------------------------------------

def doctor_sections(report: DoctorReport) -> list[Section]:
    """Findings first (summary table, then each with its evidence), then the measurements' plots."""
    counts = report.counts()
    summary = (f"{report.model}: {len(report.findings)} finding(s) (" + ", ".join(
        f"{n} {s}" for s, n in counts.items() if n) + f") from {report.n_calib_samples} calibration and "
               f"{report.n_eval_samples} evaluation sample(s).") if report.findings else \
        f"{report.model}: no problems found by the {len(report.runs)} checks."
    table = Table(("#", "severity", "check", "finding"),
                  tuple((i, f.severity, f.check, f.title) for i, f in enumerate(report.findings, 1)),
                  "doctor-findings")
    runs = Table(("check", "status", "seconds", "detail"),
                 tuple((r.check, r.status, r.seconds, r.detail) for r in report.runs), "doctor-checks")
    sections = [Section("Doctor", (summary,), (table, runs))]
    for i, finding in enumerate(report.findings, 1):
        sections.append(Section(f"{i}. [{finding.severity}] {finding.check}",
                                (finding.title, "Fix: " + finding.fix),
                                (Table(finding.evidence.columns, finding.evidence.rows),), level=3))
    sections += _doctor_measurements(report)
    return sections


def _doctor_measurements(report: DoctorReport) -> list[Section]:
    plots_mod = _plots_module
    sections: list[Section] = []
    if report.sensitivity is not None:
        highlight = report.findings[0].subjects if report.findings and \
            report.findings[0].check == "sensitive_layers" else ()
        sections += [Section(s.title, s.paragraphs, s.tables, s.plots, s.code, 3)
                     for s in sensitivity_sections(report.sensitivity, highlight)]
    if report.weights:
        weights = report.weights
        sections.append(Section("Weights zeroed per node", (
            "Share of non-zero weights that round to 0 in INT8, with one scale per tensor vs per output "
            "channel.",), (Table(("node", "op", "weights", "zeroed per-tensor", "zeroed per-channel",
                                  "in use"),
                                 tuple((w.node, w.op_type, w.nonzero, w.per_tensor, w.per_channel, w.scheme)
                                       for w in weights), "weights-zeroed"),),
            (Plot("Weights zeroed", lambda: plots_mod().weight_zeroing_chart(
                [w.node for w in weights], [w.per_tensor for w in weights], [w.per_channel for w in weights]),
                "Bar chart of zeroed weights per node"),), level=3))
    if report.calibrators:
        sections.append(calibrator_comparison_section(report.calibrators))
    if report.stability:
        sections.append(_stability_section(report))
    if report.mixed_ranges:
        rows = tuple((m.tensor, m.role, m.axis, m.scale, len(m.channel_absmax), len(m.swamped), m.sqnr_db,
                      m.swamped_sqnr_db) for m in report.mixed_ranges)
        sections.append(Section("Value ranges per channel", (
            "Each tensor under one per-tensor scale: channels where most non-zero values round to 0 "
            "(swamped) and the SQNR of the whole tensor vs of those channels.",),
            (Table(("tensor", "role", "axis", "scale", "channels", "swamped", "SQNR (dB)",
                    "swamped SQNR (dB)"), rows, "mixed-ranges"),), level=3))
    if report.lint is not None:
        sections += [Section(s.title, s.paragraphs, s.tables, s.plots, s.code, 3)
                     for s in lint_sections(report.lint)]
    return sections


def _stability_section(report: DoctorReport) -> Section:
    items = sorted(report.stability, key=lambda s: -s.spread)
    curves = [_plots_module().ScaleCurve(s.tensor, s.n_samples, s.median, s.lo, s.hi)
              for s in items[:MAX_PANELS]]
    rows = tuple((s.tensor, s.calibrator, s.scale, s.spread, s.stable) for s in items)
    return Section("Scale against number of calibration samples", (
        "Bootstrap over interleaved chunks of the calibration samples: the median scale and its 10-90 % band "
        "for growing sample counts, relative to the scale with every sample (the least stable tensors).",),
        (Table(("tensor", "calibrator", "scale", "+- (relative)", "stable"), rows, "scale-stability"),),
        (Plot("Scale vs calibration samples", lambda: _plots_module().scale_curves_chart(curves),
              "Scale against number of samples"),), level=3)


# --------------------------------------------------------------------------------------------
# Bundle
# --------------------------------------------------------------------------------------------

def bundle_sections(bundle: Any, build: Callable[[Any], list[Section]]) -> list[Section]:
    """The bundle's summary and notes, then every result's sections in order."""
    sections: list[Section] = []
    if bundle.summary is not None or bundle.notes:
        tables = (Table(bundle.summary.columns, bundle.summary.rows, "summary"),) if bundle.summary else ()
        sections.append(Section("Summary", tuple(bundle.notes), tables))
    for result in bundle.results:
        sections += build(result)
    return sections
