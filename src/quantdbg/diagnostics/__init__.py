"""Diagnostics: the static Q/DQ lint for TensorRT and ``doctor``'s checks of the classic PTQ problems."""
from quantdbg.diagnostics.doctor import DoctorConfig, DoctorReport, diagnose
from quantdbg.diagnostics.linter import LintReport, lint

__all__ = ["DoctorConfig", "DoctorReport", "LintReport", "diagnose", "lint"]
