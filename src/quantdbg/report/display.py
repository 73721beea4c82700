"""Registers the report's renderers with the display hook, so results render in notebooks.

Imported by :mod:`quantdbg._display` on the first lookup (the package facade names this module).
"""
from __future__ import annotations

from quantdbg import _display
from quantdbg.calibration import CalibrationResult
from quantdbg.diagnostics import DoctorReport, LintReport
from quantdbg.fallback import FallbackPlan
from quantdbg.report.render import ReportBundle, repr_html, to_dataframe
from quantdbg.sensitivity import SensitivityReport

for _cls in (CalibrationResult, SensitivityReport, FallbackPlan, LintReport, DoctorReport, ReportBundle):
    _display.register(_cls, html=repr_html, frame=to_dataframe)
