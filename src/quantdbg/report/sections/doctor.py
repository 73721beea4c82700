"""Sections of a doctor report: the findings first (each with its evidence), then the measurements."""
from __future__ import annotations

from quantdbg.diagnostics import DoctorReport
from quantdbg.diagnostics.checks.weight_zeroing import zeroing_evidence
from quantdbg.diagnostics.findings import Cell
from quantdbg.report.plots import ScaleCurve, png, scale_curves_figure, weight_zeroing_figure
from quantdbg.report.sections.base import MAX_PANELS, Plot, Section, Table, nested
from quantdbg.report.sections.calibration import calibrator_comparison_section
from quantdbg.report.sections.lint import lint_sections
from quantdbg.report.sections.sensitivity import sensitivity_sections


def doctor_sections(report: DoctorReport) -> list[Section]:
    """Findings first (summary table, then each with its evidence), then the measurements' plots."""
    counts = report.counts()
    summary = (f"{report.model}: {len(report.findings)} finding(s) (" + ", ".join(
        f"{n} {s}" for s, n in counts.items() if n) + f") from {report.n_calib_samples} calibration and "
               f"{report.n_eval_samples} evaluation sample(s).") if report.findings else \
        f"{report.model}: no problems found by the {len(report.runs)} checks."
    table = Table(("#", "severity", "check", "finding"),
                  tuple((i, f.severity.value, f.check, f.title) for i, f in enumerate(report.findings, 1)),
                  "doctor-findings")
    runs = Table(("check", "status", "seconds", "detail"),
                 tuple((r.check, r.status, r.seconds, r.detail) for r in report.runs), "doctor-checks")
    sections = [Section("Doctor", (summary,), (table, runs))]
    for i, finding in enumerate(report.findings, 1):
        sections.append(Section(f"{i}. [{finding.severity.value}] {finding.check}",
                                (finding.title, "Fix: " + finding.fix),
                                (Table(finding.evidence.columns, finding.evidence.rows),), level=3))
    return sections + _measurements(report)


def _measurements(report: DoctorReport) -> list[Section]:
    """A section per measurement the report holds (checks that did not run hold none)."""
    sections: list[Section] = []
    if report.sensitivity is not None:
        first = report.findings[0] if report.findings else None
        highlight = first.subjects if first is not None and first.check == "sensitive_layers" else ()
        sections += nested(sensitivity_sections(report.sensitivity, highlight))
    if report.weights:
        sections.append(_weights_section(report))
    if report.calibrators:
        sections.append(calibrator_comparison_section(report.calibrators))
    if report.stability:
        sections.append(_stability_section(report))
    if report.mixed_ranges:
        sections.append(_mixed_ranges_section(report))
    if report.lint is not None:
        sections += nested(lint_sections(report.lint))
    return sections


def _weights_section(report: DoctorReport) -> Section:
    weights = report.weights
    evidence = zeroing_evidence(weights)
    plot = Plot("Weights zeroed", lambda: png(weight_zeroing_figure(
        [w.node for w in weights], [w.per_tensor for w in weights], [w.per_channel for w in weights])),
        "Bar chart of zeroed weights per node")
    return Section("Weights zeroed per node", (
        "Percent of non-zero weights that round to 0 in INT8, with one scale per tensor vs per output "
        "channel.",), (Table(evidence.columns, evidence.rows, "weights-zeroed"),), (plot,), level=3)


def _stability_section(report: DoctorReport) -> Section:
    items = sorted(report.stability, key=lambda s: -s.spread)
    curves = [ScaleCurve(s.tensor, s.n_samples, s.median, s.lo, s.hi) for s in items[:MAX_PANELS]]
    rows = tuple((s.tensor, s.calibrator, s.scale, s.spread, s.stable) for s in items)
    return Section("Scale against number of calibration samples", (
        "Bootstrap over interleaved chunks of the calibration samples: the median scale and its 10-90 % band "
        "for growing sample counts, relative to the scale with every sample (the least stable tensors).",),
        (Table(("tensor", "calibrator", "scale", "+- (relative)", "stable"), rows, "scale-stability"),),
        (Plot("Scale vs calibration samples", lambda: png(scale_curves_figure(curves)),
              "Scale against number of samples"),), level=3)


def _mixed_ranges_section(report: DoctorReport) -> Section:
    # The swamped channels' SQNR exists only where some channel is swamped ("-" elsewhere, not nan).
    # An axis is examined whatever it holds (channels, width, sequence positions, features): its
    # slices are counted as what they are, never called channels.
    rows: tuple[tuple[Cell, ...], ...] = tuple(
        (m.tensor, m.role, m.axis, m.scale, len(m.channel_absmax), len(m.swamped), m.sqnr_db,
         m.swamped_sqnr_db if m.swamped else None) for m in report.mixed_ranges)
    columns: tuple[str, ...] = ("tensor", "role", "axis", "scale", "slices along the axis", "swamped slices",
                                "SQNR (dB)", "swamped SQNR (dB)")
    text = ("Each tensor under one per-tensor scale, cut into slices along axis 1 and along its last axis "
            "(channels, or spatial, sequence or feature positions, depending on the layout): slices where "
            "most non-zero values round to 0 (swamped) and the SQNR of the whole tensor vs of those slices.")
    if not any(m.swamped for m in report.mixed_ranges):  # no swamped slice: that SQNR is undefined
        columns, rows = columns[:-1], tuple(row[:-1] for row in rows)
        text += " No slice is swamped here."
    return Section("Value ranges along an axis", (text,), (Table(columns, rows, "mixed-ranges"),), level=3)
