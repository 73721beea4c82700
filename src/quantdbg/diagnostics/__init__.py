"""Diagnostics: the static Q/DQ lint for TensorRT and ``doctor``'s checks of the classic PTQ problems."""
from quantdbg.diagnostics.checks import CHECKS, Cell, Evidence, Finding, compare_calibrators
from quantdbg.diagnostics.doctor import DoctorConfig, DoctorReport, diagnose, format_cell
from quantdbg.diagnostics.linter import RULES, LintReport, Severity, lint

__all__ = ["CHECKS", "RULES", "Cell", "DoctorConfig", "DoctorReport", "Evidence", "Finding", "LintReport",
           "Severity", "compare_calibrators", "diagnose", "format_cell", "lint"]
