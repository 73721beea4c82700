"""Diagnostics: the static Q/DQ lint for TensorRT and ``doctor``'s checks of the classic PTQ problems.

Both speak one language (:mod:`~quantdbg.diagnostics.findings`): a :class:`Finding` with a
:class:`Severity`, its :class:`Evidence` and a fix. The lint's rules are a registry
(:mod:`~quantdbg.diagnostics.lint_rules`) over a read-only graph view
(:mod:`~quantdbg.diagnostics.qdq_graph`); the doctor's checks are a registry of one module each
(:mod:`~quantdbg.diagnostics.checks`).
"""
from quantdbg.diagnostics.doctor import DoctorReport, diagnose
from quantdbg.diagnostics.doctor_config import CHECKS, DoctorConfig
from quantdbg.diagnostics.findings import Evidence, Finding, Severity
from quantdbg.diagnostics.lint_rules import RULES
from quantdbg.diagnostics.linter import LintReport, lint

__all__ = [
    "CHECKS", "DoctorConfig", "DoctorReport", "Evidence", "Finding", "LintReport", "RULES", "Severity",
    "diagnose", "lint",
]
