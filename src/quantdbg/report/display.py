"""Registers the report's renderers with the display hook, so results render in notebooks.

Imported by :mod:`quantdbg._display` on the first lookup (the package facade names this module).
"""
from __future__ import annotations

from quantdbg import _display
from quantdbg.report.html import repr_html
from quantdbg.report.render import to_dataframe
from quantdbg.report.results import result_types

for _cls in result_types():
    _display.register(_cls, html=repr_html, frame=to_dataframe)
