"""Registers the report's renderers with the display hook, so results render in notebooks: a short
repr, the HTML sections, the Markdown report and the main table as a DataFrame.

Imported by :mod:`quantdbg._display` on the first lookup (the package facade names this module).
"""
from __future__ import annotations

from quantdbg import _display
from quantdbg.fallback import FallbackResult
from quantdbg.qdq import QuantizedModel
from quantdbg.report.html import repr_html, sections_html
from quantdbg.report.markdown import render_markdown
from quantdbg.report.render import table_frame, to_dataframe
from quantdbg.report.results import PRIMARY_TABLE, result_types
from quantdbg.report.sections.quantized import QDQ_TABLE, fallback_result_sections, quantized_sections
from quantdbg.report.summary import TEXTS

for _cls in result_types():
    _display.register(_cls, html=repr_html, frame=to_dataframe, markdown=render_markdown)
_display.register(QuantizedModel, html=lambda m: sections_html(quantized_sections(m)),
                  frame=lambda m: table_frame(m, quantized_sections(m), QDQ_TABLE))
_display.register(FallbackResult, html=lambda r: sections_html(fallback_result_sections(r)),
                  frame=lambda r: table_frame(r, fallback_result_sections(r), PRIMARY_TABLE["fallback"]))
for _cls, _text in TEXTS.items():
    _display.register(_cls, text=_text)
