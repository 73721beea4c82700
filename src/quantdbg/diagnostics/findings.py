"""What a diagnosis says: one :class:`Finding` type and one :class:`Severity` scale for lint and doctor.

A finding names what made it (a lint rule id or a doctor check), how bad it is, what is wrong and
where, the numbers behind it (an :class:`Evidence` table) and how to fix it. Table cells are
formatted for people in one place, :func:`format_cell`, which the doctor's text and the report's
HTML and Markdown all use.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import Enum

from quantdbg._json import Serializable
from quantdbg.errors import ConfigError

Cell = bool | int | float | str | None
"""A table cell: raw values, formatted only when shown. (The order matters when a cell is read
back from JSON: ``true`` stays a bool, ``3`` an int, ``"inf"`` the float it was written from.)"""

_FORMER = {"error": "high", "warning": "medium"}  # lint's words before lint and doctor shared one scale
_NEVER = "never"


class Severity(str, Enum):
    """How bad a finding is: HIGH > MEDIUM > LOW > INFO.

    Lint: HIGH when TensorRT refuses the model or computes something else, MEDIUM when a Q/DQ pair
    cannot fuse (extra layers, reformats, slower INT8), INFO when it builds and fuses but leaves
    speed or accuracy on the table. Doctor: HIGH when accuracy is being lost now.
    """

    HIGH = "high"
    MEDIUM = "medium"
    LOW = "low"
    INFO = "info"

    @property
    def rank(self) -> int:
        """3 for HIGH down to 0 for INFO (larger is worse)."""
        return len(_ORDER) - 1 - _ORDER.index(self)

    @classmethod
    def _missing_(cls, value: object) -> Severity | None:
        # Lint reports written before lint and doctor shared one scale still read.
        return cls(_FORMER[value]) if isinstance(value, str) and value in _FORMER else None

    @classmethod
    def parse(cls, word: str | Severity) -> Severity:
        """The severity a word names: its value, or lint's former ``error`` (HIGH) / ``warning`` (MEDIUM).

        Raises:
            ConfigError: ``word`` names no severity.
        """
        try:
            return cls(word)
        except ValueError:
            raise ConfigError(f"Unknown severity {word!r}; choose one of "
                              f"{', '.join(w for w in FAIL_ON if w != _NEVER)}.") from None


_ORDER: tuple[Severity, ...] = tuple(Severity)

FAIL_ON: tuple[str, ...] = (*(s.value for s in Severity), *_FORMER, _NEVER)
"""What ``--fail-on`` accepts: a severity, lint's former words ``error``/``warning``, or ``never``."""

FAIL_ON_SHOWN: tuple[str, ...] = (*(s.value for s in Severity), _NEVER)
"""The ``--fail-on`` words lint and doctor document (the former words still parse, unlisted)."""


def fail_threshold(fail_on: str | Severity) -> Severity | None:
    """The least severity that fails a run for a ``--fail-on`` word (None for ``"never"``).

    Raises:
        ConfigError: ``fail_on`` is neither a severity, ``error``/``warning`` nor ``never``.
    """
    return None if fail_on == _NEVER else Severity.parse(fail_on)


def format_cell(value: Cell) -> str:
    """Formats a table cell for people: floats to 4 significant digits, infinities as inf/-inf,
    None as ``-``, booleans as yes/no."""
    if isinstance(value, bool) or value is None:
        return "-" if value is None else ("yes" if value else "no")
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return f"{value:.4g}"
    return str(value)


def markdown_cell(value: Cell) -> str:
    """:func:`format_cell` made safe inside a Markdown table row (pipes escaped, one line)."""
    return format_cell(value).replace("|", "\\|").replace("\n", " ")


@dataclass(frozen=True)
class Evidence(Serializable):
    """A small table backing a finding.

    Attributes:
        columns: Column headers.
        rows: One tuple per row, as long as ``columns``.
    """

    columns: tuple[str, ...]
    rows: tuple[tuple[Cell, ...], ...] = ()

    def text_lines(self, max_rows: int, indent: str = "") -> list[str]:
        """The table as aligned plain-text lines.

        Args:
            max_rows: Rows shown; a last line counts the rows left out.
            indent: Prefix of every line.

        Returns:
            Header, a rule of dashes, the rows (cells as :func:`format_cell` writes them).
        """
        shown = [[format_cell(v) for v in row] for row in self.rows[:max_rows]]
        widths = [max([len(c)] + [len(r[i]) for r in shown]) for i, c in enumerate(self.columns)]

        def line(cells: Sequence[str]) -> str:
            return indent + "  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()

        out = [line(self.columns), indent + "  ".join("-" * w for w in widths)] + [line(r) for r in shown]
        if len(self.rows) > max_rows:
            out.append(f"{indent}... and {len(self.rows) - max_rows} more")
        return out


NO_EVIDENCE = Evidence(())
"""The evidence of a finding whose message says it all (lint findings)."""


@dataclass(frozen=True)
class Finding(Serializable):
    """One problem, found by a lint rule or a doctor check.

    Attributes:
        check: What found it: a doctor check (``"weight_zeroing"``) or a lint rule id
            (``"nonzero-zero-point"``).
        severity: How bad it is.
        score: Orders findings of one severity (larger = more serious; 0 for lint findings).
        title: What is wrong and where (a lint finding's full message).
        subjects: The nodes or tensors named (a lint finding names one node).
        evidence: The numbers behind it (:data:`NO_EVIDENCE` for lint findings).
        fix: What to do about it.
    """

    check: str
    severity: Severity
    score: float
    title: str
    subjects: tuple[str, ...]
    evidence: Evidence
    fix: str


def severity_counts(findings: Iterable[Finding], severities: Iterable[Severity] = _ORDER) -> dict[str, int]:
    """Findings per severity.

    Args:
        findings: The findings.
        severities: The severities to count, in the order of the result (every one present, possibly 0).

    Returns:
        Severity value -> number of findings.
    """
    found = [f.severity for f in findings]
    return {s.value: sum(f is s for f in found) for s in severities}


def reaches(findings: Iterable[Finding], fail_on: str | Severity) -> bool:
    """Whether a run fails: a finding is at or above the ``--fail-on`` threshold.

    Args:
        findings: The findings.
        fail_on: A severity, lint's former ``error``/``warning``, or ``"never"`` (never fails).

    Returns:
        True when at least one finding reaches the threshold.

    Raises:
        ConfigError: ``fail_on`` is not a word :func:`fail_threshold` knows.
    """
    threshold = fail_threshold(fail_on)
    return threshold is not None and any(f.severity.rank >= threshold.rank for f in findings)
