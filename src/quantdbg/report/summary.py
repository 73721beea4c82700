"""One-line summaries of results (their ``repr``): the key facts, never a dump of every field."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from quantdbg.calibration import CalibrationResult
from quantdbg.diagnostics import DoctorReport, LintReport
from quantdbg.fallback import FallbackPlan, FallbackResult
from quantdbg.pipeline import AutoResult
from quantdbg.qdq import CalibrationScales, QuantizedModel
from quantdbg.report.results import ReportBundle
from quantdbg.report.sections.base import fmt
from quantdbg.sensitivity import SensitivityReport

SHOWN = 4
"""Names listed before ``+N more``."""


def names(items: Sequence[str], shown: int = SHOWN) -> str:
    """``['a', 'b', 'c'] +2 more``."""
    head = repr(list(items[:shown]))
    return head if len(items) <= shown else f"{head} +{len(items) - shown} more"


def _counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{n} {severity}" for severity, n in counts.items() if n) or "none"


def calibration_text(r: CalibrationResult) -> str:
    method = r.config.method if isinstance(r.config.method, str) else type(r.config.method).__name__
    return (f"CalibrationResult({len(r.ranges)} activation tensors, method={method!r}, "
            f"{r.n_samples} samples in {r.n_batches} batches)")


def scales_text(s: CalibrationScales) -> str:
    return f"CalibrationScales({len(s.tensors)} activation tensors: {names(list(s.tensors))})"


def quantized_text(m: QuantizedModel) -> str:
    acts = sum(1 for r in m.records if r.kind.value == "activation")
    kept = (f", kept out of INT8 ({m.excluded_precision.value if m.excluded_precision else '?'}): "
            f"{names(m.excluded)}" if m.excluded else "")
    return (f"QuantizedModel({len(m.layers)} quantized layers, {len(m.records)} Q/DQ pairs "
            f"({acts} activation, {len(m.records) - acts} weight){kept})")


def sensitivity_text(r: SensitivityReport) -> str:
    top = ", ".join(f"{layer.node} ({fmt(layer.value)})" for layer in r.layers[:3])
    return (f"SensitivityReport(mode={r.mode!r}, metric={r.metric!r}, {len(r.layers)} layers, "
            f"most sensitive: {top or 'none'})")


def _kept_out(exclude: Sequence[str], n_layers: int, precision: str = "") -> str:
    """``2 of 9 layers out of INT8 (fp16): ['a', 'b']``, with the precision where it is known."""
    within = f" ({precision})" if precision else ""
    return f"{len(exclude)} of {n_layers} layers out of INT8{within}: {names(exclude)}"


def plan_text(p: FallbackPlan) -> str:
    return (f"FallbackPlan(status={p.status!r}, {_kept_out(p.exclude, len(p.ranking), p.precision.value)}, "
            f"value={fmt(p.value)}, target={p.target.describe()!r}, {p.n_evaluations} evaluations)")


def fallback_result_text(r: FallbackResult) -> str:
    return (f"FallbackResult(status={r.plan.status!r}, exclude={names(r.plan.exclude)}, "
            f"value={fmt(r.plan.value)}, mixed model: {'none' if r.mixed is None else 'yes'})")


def auto_text(r: AutoResult) -> str:
    return (f"AutoResult(outcome={r.outcome!r}, {r.metric} {fmt(r.final_value)} vs FP32 {fmt(r.fp32_value)}, "
            f"{_kept_out(r.exclude, r.n_layers)}, {r.n_evaluations} evaluations)")


def doctor_text(r: DoctorReport) -> str:
    fired = [run.check for run in r.runs if run.status == "fired"]
    return (f"DoctorReport({r.model!r}: {len(r.findings)} findings ({_counts(r.counts())}), "
            f"fired: {names(fired)})")


def lint_text(r: LintReport) -> str:
    return f"LintReport({r.model!r}: {len(r.findings)} findings ({_counts(r.counts())}))"


def bundle_text(b: ReportBundle) -> str:
    return f"ReportBundle({b.title!r}: {', '.join(type(r).__name__ for r in b.results)})"


TEXTS: dict[type, Any] = {
    CalibrationResult: calibration_text, CalibrationScales: scales_text, QuantizedModel: quantized_text,
    SensitivityReport: sensitivity_text, FallbackPlan: plan_text, FallbackResult: fallback_result_text,
    AutoResult: auto_text, DoctorReport: doctor_text, LintReport: lint_text, ReportBundle: bundle_text}
"""Result class -> its one-line summary."""
