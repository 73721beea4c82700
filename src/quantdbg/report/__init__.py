"""Reports: every result as self-contained HTML, Markdown, JSON, a DataFrame or notebook display.

``results`` (which kinds exist, :class:`ReportBundle`, JSON) -> ``sections`` (what a report says
about each kind, one module per kind, dispatched on the result's class) -> ``html`` / ``markdown``
(formats) -> ``render`` (files, DataFrames); ``plots`` draws the figures, ``display`` registers the
notebook renderers.
"""
from quantdbg.report.html import render_html
from quantdbg.report.markdown import render_markdown
from quantdbg.report.render import WrittenReport, to_dataframe, write_report
from quantdbg.report.results import ReportBundle, load_result

__all__ = [
    "ReportBundle", "WrittenReport", "load_result", "render_html", "render_markdown", "to_dataframe",
    "write_report",
]
