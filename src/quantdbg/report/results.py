"""The results a report renders: which kinds exist, a bundle of several, and their JSON.

A report renders any of :class:`~quantdbg.calibration.CalibrationResult`,
:class:`~quantdbg.qdq.CalibrationScales`, :class:`~quantdbg.sensitivity.SensitivityReport`,
:class:`~quantdbg.fallback.FallbackPlan`, :class:`~quantdbg.diagnostics.LintReport`,
:class:`~quantdbg.diagnostics.DoctorReport`, :class:`~quantdbg.pipeline.AutoResult`, or a
:class:`ReportBundle` of several. Its JSON is the result's own ``to_dict()``, a tagged document that
:func:`load_result` reads back through the one codec (:mod:`quantdbg._json`), which knows every tag.
"""
from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from quantdbg import _display, _json
from quantdbg.calibration import CalibrationResult
from quantdbg.diagnostics import DoctorReport, Evidence, LintReport
from quantdbg.errors import ConfigError, FormatError
from quantdbg.fallback import FallbackPlan
from quantdbg.pipeline import AutoResult
from quantdbg.qdq import CalibrationScales
from quantdbg.sensitivity import SensitivityReport

ResultKind = Literal["calibration", "scales", "sensitivity", "fallback", "lint", "doctor", "auto", "bundle"]
KINDS: tuple[ResultKind, ...] = get_args(ResultKind)

PRIMARY_TABLE: Mapping[ResultKind, str] = {
    "calibration": "calibration-ranges", "scales": "scale-ranges", "sensitivity": "sensitivity-ranking",
    "fallback": "fallback-evaluations", "lint": "lint-findings", "doctor": "doctor-findings",
    "auto": "auto-summary", "bundle": "summary"}
"""Each kind's main table (what :func:`quantdbg.report.to_dataframe` returns)."""

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
        at = f"{where}." if where else ""
        results = tuple(_json.decode(_TYPES[m.kind], m.data, f"{at}results[{i}].data")
                        for i, m in enumerate(form.results))
        return _json.construct(cls, {"title": form.title, "results": results, "summary": form.summary,
                                     "notes": form.notes}, where)


_TYPES: Mapping[ResultKind, type] = {
    "calibration": CalibrationResult, "scales": CalibrationScales, "sensitivity": SensitivityReport,
    "fallback": FallbackPlan, "lint": LintReport, "doctor": DoctorReport, "auto": AutoResult,
    "bundle": ReportBundle}


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
                      "CalibrationScales, SensitivityReport, FallbackPlan, LintReport, DoctorReport, "
                      "AutoResult or ReportBundle.")


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


_RENDERABLE = ("A report renders a calibration result, a scales file (`quantdbg calibrate --scales`), a "
               "sensitivity report (`quantdbg analyze --out`), a fallback plan (`quantdbg fallback --plan`), "
               "a lint report (`quantdbg lint --json`), a doctor report (`quantdbg doctor --json`), an "
               "automatic flow's result (`quantdbg auto --plan`) or a report bundle (`quantdbg demo`).")


def _result_class(data: Any, kind: str | None, source: str) -> type:
    """The class to read ``data`` as: ``kind``'s, or the one its tag names (the codec's registry)."""
    if kind is not None:
        if kind not in _TYPES:
            raise ConfigError(f"Unknown result kind {kind!r}; expected one of {', '.join(KINDS)}.")
        return _TYPES[kind]  # type: ignore[index]
    try:
        cls = _json.detect(data, source)
    except FormatError as err:
        raise FormatError(f"{err} {_RENDERABLE}") from None
    if cls not in _TYPES.values():
        raise ConfigError(f"{source} is a {_json.format_of(cls)} document, which is not a result a report "
                          f"renders. {_RENDERABLE}")
    return cls


def result_from_dict(data: Any, kind: str | None = None, source: str = "<data>") -> Any:
    """Rebuilds a result from its ``to_dict()`` form.

    Args:
        data: The parsed JSON.
        kind: Its kind (None: the one its format tag names; untagged files of earlier versions
            are recognised by the codec, :func:`quantdbg._json.detect`).
        source: Names the data in errors (usually the file).

    Returns:
        The result object.

    Raises:
        ConfigError: The kind is unknown, or the document is not one a report renders.
        FormatError: Not a quantdbg document, or not a valid result of its kind (the field is named).
    """
    return _json.load(_result_class(data, kind, source), data, source)


def load_result(path: str | os.PathLike) -> Any:
    """Reads any result JSON written by quantdbg (see :func:`result_from_dict`).

    Raises:
        FormatError: The file is missing, not JSON (or nested absurdly deep), not a quantdbg
            document, or a field is wrong (file and field named).
        ConfigError: The document is not one a report renders.
    """
    return result_from_dict(_json.read_json(path), source=repr(os.fspath(path)))


def render_json(result: Any) -> str:
    """The result's ``to_dict()`` as indented JSON (infinities as strings, so it is strict JSON).

    Raises:
        ConfigError: ``result`` is not a renderable result.
    """
    kind_of(result)
    return json.dumps(result.to_dict(), indent=2, allow_nan=False) + "\n"  # keeps graph order
