"""The parts of a report: sections holding paragraphs, tables of raw values and plots drawn on demand.

:mod:`quantdbg.report.html` and :mod:`quantdbg.report.markdown` turn sections into pages;
:func:`quantdbg.report.to_dataframe` turns a section's table into a DataFrame.
"""
from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, replace

from quantdbg.diagnostics.findings import Cell

MAX_ROWS = 200
"""Rows shown per table; the JSON and the DataFrame keep every row."""
MAX_PANELS = 8
"""Histogram panels drawn per report."""
MAX_BARS = 30
"""Layers drawn in a ranking chart."""


@dataclass(frozen=True)
class Table:
    """A table of raw values (formatted only when rendered).

    Attributes:
        columns: Column headers.
        rows: Rows of cells.
        css_id: HTML id (e.g. ``"sensitivity-ranking"``); also marks the table a DataFrame is made from.
        caption: One line above the table.
    """

    columns: tuple[str, ...]
    rows: tuple[tuple[Cell, ...], ...]
    css_id: str = ""
    caption: str = ""


@dataclass(frozen=True)
class Plot:
    """A figure drawn on demand.

    Attributes:
        title: Caption.
        draw: Returns PNG bytes (needs matplotlib).
        alt: Text alternative.
    """

    title: str
    draw: Callable[[], bytes]
    alt: str


@dataclass(frozen=True)
class Section:
    """One part of a report.

    Attributes:
        title: Heading.
        paragraphs: Plain-text paragraphs.
        tables: Tables, in order.
        plots: Plots, in order (after the paragraphs, before the tables).
        code: Preformatted lines (commands).
        level: Heading level (2 for a result, 3 for its parts).
        items: A bulleted list, after the paragraphs.
        lead: Part of the first screen: shown before the table of contents, its commands before
            its tables.
    """

    title: str
    paragraphs: tuple[str, ...] = ()
    tables: tuple[Table, ...] = ()
    plots: tuple[Plot, ...] = ()
    code: tuple[str, ...] = ()
    level: int = 2
    items: tuple[str, ...] = ()
    lead: bool = False

    @property
    def anchor(self) -> str:
        """A URL fragment made from the title."""
        return re.sub(r"[^a-z0-9]+", "-", self.title.lower()).strip("-") or "section"


def nested(sections: list[Section]) -> list[Section]:
    """The same sections one heading level down (a result's sections shown inside another's)."""
    return [replace(s, level=3) for s in sections]


def fmt(value: float | None, spec: str = ".4g") -> str:
    """A number in running text (``n/a`` for None or NaN)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    return format(value, spec)
