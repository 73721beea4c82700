"""Reports: every result as self-contained HTML, Markdown, JSON, a DataFrame or notebook display.

``results`` (which kinds exist, :class:`ReportBundle`, JSON) -> ``sections`` (what a report says
about each kind, one module per kind, dispatched on the result's class) -> ``html`` / ``markdown``
(formats) -> ``render`` (files, DataFrames); ``plots`` draws the figures, ``display`` registers the
notebook renderers.
"""
from quantdbg._exports import public_names as _public_names
from quantdbg.report.html import render_html as render_html
from quantdbg.report.html import repr_html as repr_html
from quantdbg.report.markdown import render_markdown as render_markdown
from quantdbg.report.render import WrittenReport as WrittenReport
from quantdbg.report.render import to_dataframe as to_dataframe
from quantdbg.report.render import write_report as write_report
from quantdbg.report.results import KINDS as KINDS
from quantdbg.report.results import PRIMARY_TABLE as PRIMARY_TABLE
from quantdbg.report.results import ReportBundle as ReportBundle
from quantdbg.report.results import ResultKind as ResultKind
from quantdbg.report.results import kind_of as kind_of
from quantdbg.report.results import load_result as load_result
from quantdbg.report.results import render_json as render_json
from quantdbg.report.results import report_title as report_title
from quantdbg.report.results import result_from_dict as result_from_dict
from quantdbg.report.results import result_types as result_types
from quantdbg.report.sections.base import Plot as Plot
from quantdbg.report.sections.base import Section as Section
from quantdbg.report.sections.base import Table as Table
from quantdbg.report.sections.registry import sections_of as sections_of

__all__ = _public_names(globals())
