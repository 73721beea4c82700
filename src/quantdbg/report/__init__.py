"""Reports: every result as self-contained HTML, Markdown, JSON, a DataFrame or notebook display.

``results`` (which kinds exist, :class:`ReportBundle`, JSON) -> ``sections`` (what a report says
about each kind, one module per kind, dispatched on the result's class) -> ``html`` / ``markdown``
(formats) -> ``render`` (files, DataFrames); ``plots`` draws the figures, ``display`` registers the
notebook renderers.
"""
from quantdbg._exports import public_names as _public_names
from quantdbg.report.html import render_html, repr_html
from quantdbg.report.markdown import render_markdown
from quantdbg.report.render import WrittenReport, to_dataframe, write_report
from quantdbg.report.results import (
    KINDS,
    PRIMARY_TABLE,
    ReportBundle,
    ResultKind,
    kind_of,
    load_result,
    render_json,
    report_title,
    result_from_dict,
    result_types,
)
from quantdbg.report.sections.base import Plot, Section, Table
from quantdbg.report.sections.registry import sections_of

__all__ = _public_names(globals())
