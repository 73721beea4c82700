"""The results a report renders: which kinds exist, a bundle of several, and their JSON.

A report renders any of :class:`~quantdbg.calibration.CalibrationResult`,
:class:`~quantdbg.sensitivity.SensitivityReport`, :class:`~quantdbg.fallback.FallbackPlan`,
:class:`~quantdbg.diagnostics.LintReport`, :class:`~quantdbg.diagnostics.DoctorReport`,
:class:`~quantdbg.pipeline.AutoResult`, or a :class:`ReportBundle` of several. Its JSON is the result's
own ``to_dict()``, which :func:`load_result` reads back.
"""
from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args

from quantdbg import _display, _json
from quantdbg.calibration import CalibrationResult
from quantdbg.diagnostics import DoctorReport, Evidence, LintReport
from quantdbg.errors import ConfigError
from quantdbg.fallback import FallbackPlan
from quantdbg.pipeline import AutoResult
from quantdbg.sensitivity import SensitivityReport

ResultKind = Literal["calibration", "sensitivity", "fallback", "lint", "doctor", "auto", "bundle"]
KINDS: tuple[ResultKind, ...] = get_args(ResultKind)

PRIMARY_TABLE: Mapping[ResultKind, str] = {
    "calibration": "calibration-ranges", "sensitivity": "sensitivity-ranking",
    "fallback": "fallback-evaluations", "lint": "lint-findings", "doctor": "doctor-findings",
    "auto": "auto-summary", "bundle": "summary"}
"""Each kind's main table (what :func:`quantdbg.report.to_dataframe` returns)."""

# A result file's format tag (before the version) -> its kind; calibration and lint files have none.
_FORMATS: Mapping[str, ResultKind] = {
    "quantdbg.report/": "bundle", "quantdbg.doctor/": "doctor", "quantdbg.sensitivity/": "sensitivity",
    "quantdbg.fallback_plan/": "fallback", "quantdbg.auto/": "auto"}


@dataclass(frozen=True)
class _Member:
    """One result of a bundle as the bundle's JSON holds it."""

    kind: ResultKind
    data: dict[str, Any]


@dataclass(frozen=True)
class _BundleForm:
    """A bundle's JSON form (its results tagged with their kinds)."""

    title: str
    summary: Evidence | None = None
    notes: tuple[str, ...] = ()
    results: tuple[_Member, ...] = field(kw_only=True)


@_json.document("quantdbg.report", 1)
@dataclass(frozen=True, repr=False)
class ReportBundle(_display.Displayable, _json.Serializable):
    """Several results in one report (what ``quantdbg demo`` writes).

    Attributes:
        title: The report's title.
        results: The results, in the order they are shown.
        summary: A summary table shown first (e.g. FP32 vs INT8 vs mixed accuracy).
        notes: Paragraphs shown under the summary.

    Raises:
        ConfigError: A result is itself a bundle.
    """

    title: str
    results: tuple[Any, ...]
    summary: Evidence | None = None
    notes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "results", tuple(self.results))
        object.__setattr__(self, "notes", tuple(self.notes))
        for result in self.results:
            if kind_of(result) == "bundle":
                raise ConfigError("A ReportBundle cannot hold another bundle; list its results instead.")

    def __json_encode__(self) -> dict[str, Any]:
        members = tuple(_Member(kind_of(r), r.to_dict()) for r in self.results)
        return _json.encode(_BundleForm(self.title, self.summary, self.notes, results=members))  # type: ignore[no-any-return]

    @classmethod
    def __json_decode__(cls, data: Any, where: str) -> ReportBundle:
        form = _json.decode(_BundleForm, data, where)
        return cls(form.title, tuple(result_from_dict(m.data, m.kind) for m in form.results), form.summary,
                   form.notes)


_TYPES: Mapping[ResultKind, type] = {
    "calibration": CalibrationResult, "sensitivity": SensitivityReport, "fallback": FallbackPlan,
    "lint": LintReport, "doctor": DoctorReport, "auto": AutoResult, "bundle": ReportBundle}


def result_types() -> tuple[type, ...]:
    """Every class a report renders."""
    return tuple(_TYPES.values())


def kind_of(result: Any) -> ResultKind:
    """Returns which kind of result ``result`` is.

    Raises:
        ConfigError: It is not a result quantdbg can render.
    """
    for kind, cls in _TYPES.items():
        if isinstance(result, cls):
            return kind
    raise ConfigError(f"Cannot render a {type(result).__name__}; pass one of CalibrationResult, "
                      "SensitivityReport, FallbackPlan, LintReport, DoctorReport, AutoResult or "
                      "ReportBundle.")


def report_title(result: Any, title: str | None = None) -> str:
    """The title a page about ``result`` carries (``title`` when given).

    Raises:
        ConfigError: ``result`` is not a renderable result.
    """
    if title:
        return title
    if isinstance(result, ReportBundle):
        return result.title
    return f"quantdbg {kind_of(result)} report"


def _detect(data: Mapping[str, Any]) -> ResultKind:
    fmt = str(data.get("format", ""))
    for prefix, kind in _FORMATS.items():
        if fmt.startswith(prefix):
            return kind
    if {"ranges", "stats", "config"} <= set(data):
        return "calibration"
    findings = data.get("findings")
    if isinstance(findings, list) and "counts" in data and all("rule" in f for f in findings):
        return "lint"
    raise ConfigError("This JSON is not a quantdbg result: expected a calibration result, a sensitivity "
                      "report (`quantdbg analyze --out`), a fallback plan (`quantdbg fallback --plan`), a "
                      "lint report, a doctor report (`quantdbg doctor --json`), an automatic flow's result "
                      "(`quantdbg auto --plan`) or a report bundle.")


def result_from_dict(data: Mapping[str, Any], kind: str | None = None) -> Any:
    """Rebuilds a result from its ``to_dict()`` form.

    Args:
        data: The dict.
        kind: Its kind (None: detected from the format marker or the keys).

    Returns:
        The result object.

    Raises:
        ConfigError: The kind is unknown or cannot be detected.
        FormatError: The data is not a valid result of its kind.
    """
    kind = kind or _detect(data)
    if kind not in _TYPES:
        raise ConfigError(f"Unknown result kind {kind!r}; expected one of {', '.join(KINDS)}.")
    return _TYPES[kind].from_dict(data)  # type: ignore[index, attr-defined]


def load_result(path: str | os.PathLike) -> Any:
    """Reads any result JSON written by quantdbg (see :func:`result_from_dict`).

    Raises:
        ConfigError: The file is missing, not JSON, or not a quantdbg result.
    """
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as err:
        raise ConfigError(f"Cannot read result {str(path)!r}: {err}") from err
    if not isinstance(data, dict):
        raise ConfigError(f"{str(path)!r} holds a JSON {type(data).__name__}, not a quantdbg result object.")
    return result_from_dict(data)


def render_json(result: Any) -> str:
    """The result's ``to_dict()`` as indented JSON (infinities as strings, so it is strict JSON).

    Raises:
        ConfigError: ``result`` is not a renderable result.
    """
    kind_of(result)
    return json.dumps(result.to_dict(), indent=2, allow_nan=False) + "\n"  # keeps graph order
