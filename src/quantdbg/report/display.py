"""Registers the report's renderers with the display hook, so results render in notebooks.

Imported by :mod:`quantdbg._display` on the first lookup (the package facade names this module).
"""
from __future__ import annotations

from quantdbg import _display
from quantdbg.calibration.ranges import CalibrationResult
from quantdbg.diagnostics.doctor import DoctorReport
from quantdbg.diagnostics.linter import LintReport
from quantdbg.fallback.search import FallbackPlan
from quantdbg.report.render import ReportBundle, repr_html, to_dataframe
from quantdbg.sensitivity.analyze import SensitivityReport

for _cls in (CalibrationResult, SensitivityReport, FallbackPlan, LintReport, DoctorReport, ReportBundle):
    _display.register(_cls, html=repr_html, frame=to_dataframe)
