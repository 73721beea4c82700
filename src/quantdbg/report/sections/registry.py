"""The sections of any result, dispatched on its class (``functools.singledispatch``)."""
from __future__ import annotations

import functools
from typing import Any

from quantdbg.calibration import CalibrationResult
from quantdbg.diagnostics import DoctorReport, LintReport
from quantdbg.fallback import FallbackPlan
from quantdbg.pipeline import AutoResult
from quantdbg.qdq import CalibrationScales
from quantdbg.report.results import ReportBundle, kind_of
from quantdbg.report.sections.auto import auto_sections
from quantdbg.report.sections.base import Section
from quantdbg.report.sections.bundle import bundle_sections
from quantdbg.report.sections.calibration import calibration_sections, scales_sections
from quantdbg.report.sections.doctor import doctor_sections
from quantdbg.report.sections.fallback import fallback_sections
from quantdbg.report.sections.lint import lint_sections
from quantdbg.report.sections.sensitivity import sensitivity_sections
from quantdbg.report.sections.verdict import VerdictSources, auto_lead, gather, plan_lead
from quantdbg.sensitivity import SensitivityReport


@functools.singledispatch
def sections_of(result: Any) -> list[Section]:
    """The report sections of any result.

    Raises:
        ConfigError: ``result`` is not a renderable result.
    """
    kind_of(result)  # raises: every renderable class has its own registration below
    raise AssertionError(f"no sections registered for {type(result).__name__}")


sections_of.register(CalibrationResult, calibration_sections)
sections_of.register(CalibrationScales, scales_sections)
sections_of.register(SensitivityReport, sensitivity_sections)
sections_of.register(LintReport, lint_sections)
sections_of.register(DoctorReport, doctor_sections)


@sections_of.register(FallbackPlan)
def _plan(plan: FallbackPlan) -> list[Section]:
    return plan_lead(VerdictSources(plan)) + fallback_sections(plan, commands=False)


@sections_of.register(AutoResult)
def _auto(result: AutoResult) -> list[Section]:
    return auto_lead(result) + auto_sections(result)


@sections_of.register(ReportBundle)
def _bundle(bundle: ReportBundle) -> list[Section]:
    # In a bundle, the layers a fallback plan keeps out of INT8 are marked on the ranking charts.
    kept = tuple(node for r in bundle.results if isinstance(r, FallbackPlan) for node in r.exclude)

    def member(item: Any) -> list[Section]:
        if kept and isinstance(item, SensitivityReport):
            return sensitivity_sections(item, highlight=kept)
        if isinstance(item, FallbackPlan):  # its verdict and commands lead the bundle
            return fallback_sections(item, commands=False)
        return sections_of(item)

    return plan_lead(gather(bundle.results)) + bundle_sections(bundle, member)
