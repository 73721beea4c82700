"""Sections of a report bundle: its summary and notes, then every result's sections in order."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from quantdbg.report.results import ReportBundle
from quantdbg.report.sections.base import Section, Table


def bundle_sections(bundle: ReportBundle, build: Callable[[Any], list[Section]]) -> list[Section]:
    """The bundle's summary and notes, then every result's sections in order.

    Args:
        bundle: The bundle.
        build: Result -> its sections (the registry's dispatch, with a bundle's highlights).

    Returns:
        The sections.
    """
    sections: list[Section] = []
    if bundle.summary is not None or bundle.notes:
        tables = (Table(bundle.summary.columns, bundle.summary.rows, "summary"),) if bundle.summary else ()
        sections.append(Section("Summary", tuple(bundle.notes), tables))
    for result in bundle.results:
        sections += build(result)
    return sections
