"""Sections of a lint report: counts per severity and one row per finding."""
from __future__ import annotations

from quantdbg.diagnostics import LintReport
from quantdbg.report.sections.base import Section, Table


def lint_sections(report: LintReport) -> list[Section]:
    """Counts per severity and one row per finding."""
    counts = ", ".join(f"{n} {s}" for s, n in report.counts().items()) if report.findings else "no findings"
    text = f"TensorRT Q/DQ lint of {report.model or 'the model'}: {counts}."
    rows = tuple((f.severity.value, f.check, f.subjects[0], f.title, f.fix) for f in report.findings)
    return [Section("TensorRT Q/DQ lint", (text,),
                    (Table(("severity", "rule", "node", "finding", "fix"), rows, "lint-findings"),))]
