"""Every format of a result in one call: files (HTML, Markdown, JSON) and DataFrames.

Nothing is written unless the caller passes a path (:func:`write_report`, atomic writes). Plots
need matplotlib and DataFrames need pandas (extra ``report``); both load lazily.
"""
from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from quantdbg._io import commit_together, write_text_atomic
from quantdbg._optional import load
from quantdbg.errors import ConfigError
from quantdbg.report.html import render_html
from quantdbg.report.markdown import render_markdown
from quantdbg.report.results import PRIMARY_TABLE, ReportBundle, kind_of, render_json
from quantdbg.report.sections.base import Section
from quantdbg.report.sections.registry import sections_of
from quantdbg.report.summary import TEXTS


@dataclass(frozen=True)
class WrittenReport:
    """Where :func:`write_report` wrote (None for a format not requested).

    Attributes:
        html: The HTML file.
        markdown: The Markdown file.
        json: The JSON file.
    """

    html: Path | None = None
    markdown: Path | None = None
    json: Path | None = None


def write_report(result: Any, *, html: str | os.PathLike | None = None,
                 markdown: str | os.PathLike | None = None, json: str | os.PathLike | None = None,
                 title: str | None = None, plots: bool = True) -> WrittenReport:
    """Writes the requested formats together: all of them, or (on any failure) none; nothing else is
    written.

    Args:
        result: Any renderable result.
        html: Destination of the HTML report.
        markdown: Destination of the Markdown report.
        json: Destination of the JSON.
        title: Report title.
        plots: Draw plots in the HTML.

    Returns:
        The paths written.

    Raises:
        ConfigError: Nothing to write, a folder does not exist, two formats share a path, or
            ``result`` is not renderable.
        MissingDependencyError: HTML plots need matplotlib.
        OutputError: A file cannot be written (a full disk, a read-only folder); none was.
    """
    if html is None and markdown is None and json is None:
        raise ConfigError("write_report() needs at least one of html=, markdown= or json= (a path).")
    renders = {"json": lambda: render_json(result), "markdown": lambda: render_markdown(result, title=title),
               "html": lambda: render_html(result, title=title, plots=plots)}
    paths = {"json": json, "markdown": markdown, "html": html}
    with commit_together(paths) as staged:
        for name, path in staged.items():
            write_text_atomic(path, renders[name]())
    return WrittenReport(**{name: Path(path) for name, path in paths.items() if path is not None})


def to_dataframe(result: Any) -> Any:
    """The result's main table as a pandas DataFrame (raw values, every row).

    The main table: calibration ranges, sensitivity ranking, fallback evaluations, lint findings,
    doctor findings, or a bundle's summary (without one: its results, one row each).

    Raises:
        MissingDependencyError: pandas is not installed (extra ``report``).
        ConfigError: ``result`` is not renderable or has no main table.
    """
    pandas = load("pandas", "report")
    if isinstance(result, ReportBundle) and result.summary is None:  # its results, one row each
        rows = [(kind_of(r), TEXTS[type(r)](r) if type(r) in TEXTS else type(r).__name__)
                for r in result.results]
        return pandas.DataFrame(rows, columns=["kind", "result"])
    return table_frame(result, sections_of(result), PRIMARY_TABLE[kind_of(result)])


def table_frame(result: Any, sections: Sequence[Section], wanted: str) -> Any:
    """The table ``wanted`` (a css id) of ``sections`` as a DataFrame.

    Raises:
        MissingDependencyError: pandas is not installed (extra ``report``).
        ConfigError: No such table.
    """
    pandas = load("pandas", "report")
    for section in sections:
        for table in section.tables:
            if table.css_id == wanted:
                return pandas.DataFrame(list(table.rows), columns=list(table.columns))
    raise ConfigError(f"This {type(result).__name__} has no {wanted!r} table to turn into a DataFrame.")
