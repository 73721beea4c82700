"""Markdown reports: the same headings, paragraphs, tables and commands as HTML, without plots."""
from __future__ import annotations

from typing import Any

from quantdbg.diagnostics.findings import markdown_cell
from quantdbg.report.results import report_title
from quantdbg.report.sections.base import MAX_ROWS, Table
from quantdbg.report.sections.registry import sections_of


def _table_md(table: Table) -> list[str]:
    lines = [table.caption, ""] if table.caption else []
    lines += ["| " + " | ".join(markdown_cell(c) for c in table.columns) + " |",
              "|" + "|".join("---" for _ in table.columns) + "|"]
    lines += ["| " + " | ".join(markdown_cell(v) for v in row) + " |" for row in table.rows[:MAX_ROWS]]
    if len(table.rows) > MAX_ROWS:
        lines += ["", f"_{len(table.rows) - MAX_ROWS} more row(s) in the JSON report._"]
    return lines + [""]


def render_markdown(result: Any, *, title: str | None = None) -> str:
    """The report as Markdown: headings, paragraphs, tables and commands (plots are HTML-only).

    Raises:
        ConfigError: ``result`` is not renderable.
    """
    lines = [f"# {report_title(result, title)}", ""]
    for section in sections_of(result):
        lines += ["#" * min(max(section.level, 2), 4) + " " + section.title, ""]
        for paragraph in section.paragraphs:
            lines += [paragraph, ""]
        if section.items:
            lines += [*(f"- {item}" for item in section.items), ""]
        for plot in section.plots:
            lines += [f"_Plot in the HTML report: {plot.title}._", ""]
        if section.code:
            lines += ["```", *section.code, "```", ""]
        for table in section.tables:
            lines += _table_md(table)
    return "\n".join(lines).rstrip() + "\n"
