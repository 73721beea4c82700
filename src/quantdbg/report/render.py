"""Reports for every result: self-contained HTML, Markdown, JSON, DataFrames and notebook display.

Any of :class:`~quantdbg.calibrate.CalibrationResult`, :class:`~quantdbg.sensitivity.SensitivityReport`,
:class:`~quantdbg.fallback.FallbackPlan`, :class:`~quantdbg.lint.LintReport`,
:class:`~quantdbg.doctor.DoctorReport`, or a :class:`ReportBundle` of several, renders to:

* HTML: one file, plots embedded as base64 PNG, no script and no network access (a
  Content-Security-Policy forbids any load but inline styles and ``data:`` images);
* Markdown: the same text and tables, without plots;
* JSON: the result's own ``to_dict()``, which :func:`load_result` reads back.

Nothing is written unless the caller passes a path (:func:`write_report`, atomic writes).
Plots need matplotlib and DataFrames need pandas (extra ``report``); both load lazily.
"""
from __future__ import annotations

import base64
import html
import importlib
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args

from quantdbg._io import write_text_atomic
from quantdbg._optional import is_available, load
from quantdbg._version import __version__
from quantdbg.diagnostics import Evidence
from quantdbg.errors import ConfigError
from quantdbg.report import sections as rs

ResultKind = Literal["calibration", "sensitivity", "fallback", "lint", "doctor", "bundle"]
KINDS: tuple[str, ...] = get_args(ResultKind)
BUNDLE_FORMAT = "quantdbg.report/1"

# kind -> (module, class) of the result type; imported only when a result is examined.
_TYPES: Mapping[str, tuple[str, str]] = {
    "calibration": ("quantdbg.calibration.ranges", "CalibrationResult"),
    "sensitivity": ("quantdbg.sensitivity", "SensitivityReport"),
    "fallback": ("quantdbg.fallback", "FallbackPlan"),
    "lint": ("quantdbg.diagnostics.linter", "LintReport"),
    "doctor": ("quantdbg.diagnostics.doctor", "DoctorReport"),
    "bundle": ("quantdbg.report.render", "ReportBundle"),
}
_PRIMARY = {"calibration": "calibration-ranges", "sensitivity": "sensitivity-ranking",
            "fallback": "fallback-evaluations", "lint": "lint-findings", "doctor": "doctor-findings",
            "bundle": "summary"}
_FORMATS = {"quantdbg.report/": "bundle", "quantdbg.doctor/": "doctor",
            "quantdbg.sensitivity/": "sensitivity", "quantdbg.fallback_plan/": "fallback"}


@dataclass(frozen=True)
class ReportBundle:
    """Several results in one report (what ``quantdbg demo`` writes).

    Attributes:
        title: The report's title.
        results: The results, in the order they are shown.
        summary: A summary table shown first (e.g. FP32 vs INT8 vs mixed accuracy).
        notes: Paragraphs shown under the summary.
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

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict; every result is stored with its kind."""
        return {"format": BUNDLE_FORMAT, "title": self.title,
                "summary": None if self.summary is None else self.summary.to_dict(),
                "notes": list(self.notes),
                "results": [{"kind": kind_of(r), "data": r.to_dict()} for r in self.results]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ReportBundle:
        """Inverse of :meth:`to_dict`.

        Raises:
            ConfigError: ``data`` is not a bundle or holds an unknown kind of result.
        """
        if not str(data.get("format", "")).startswith("quantdbg.report/"):
            raise ConfigError(f"Not a quantdbg report bundle (format {data.get('format')!r}).")
        results = tuple(result_from_dict(item["data"], item["kind"]) for item in data["results"])
        summary = data.get("summary")
        return cls(data["title"], results, None if summary is None else Evidence.from_dict(summary),
                   tuple(data.get("notes", ())))

    def _repr_html_(self) -> str:
        return repr_html(self)


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


# --------------------------------------------------------------------------------------------
# Kinds, JSON
# --------------------------------------------------------------------------------------------

def _type(kind: str) -> type | None:
    module, name = _TYPES[kind]
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):  # a result type that does not exist cannot be passed in
        return None


def kind_of(result: Any) -> ResultKind:
    """Returns which kind of result ``result`` is.

    Raises:
        ConfigError: It is not a result quantdbg can render.
    """
    for kind in KINDS:
        cls = _type(kind)
        if cls is not None and isinstance(result, cls):
            return kind  # type: ignore[return-value]
    raise ConfigError(f"Cannot render a {type(result).__name__}; pass one of CalibrationResult, "
                      "SensitivityReport, FallbackPlan, LintReport, DoctorReport or ReportBundle.")


def _detect(data: Mapping[str, Any]) -> str:
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
                      "lint report, a doctor report (`quantdbg doctor --json`) or a report bundle.")


def result_from_dict(data: Mapping[str, Any], kind: str | None = None) -> Any:
    """Rebuilds a result from its ``to_dict()`` form.

    Args:
        data: The dict.
        kind: Its kind (None: detected from the format marker or the keys).

    Returns:
        The result object.

    Raises:
        ConfigError: The kind is unknown or cannot be detected.
    """
    kind = kind or _detect(data)
    if kind not in KINDS:
        raise ConfigError(f"Unknown result kind {kind!r}; expected one of {', '.join(KINDS)}.")
    cls = _type(kind)
    if cls is None:
        raise ConfigError(f"Results of kind {kind!r} need {_TYPES[kind][0]}, which is not available here.")
    return cls.from_dict(data)  # type: ignore[attr-defined]


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
    """The result's ``to_dict()`` as indented JSON (infinities as strings, so it is strict JSON)."""
    kind_of(result)
    return json.dumps(result.to_dict(), indent=2, allow_nan=False) + "\n"  # keeps graph order


# --------------------------------------------------------------------------------------------
# Sections
# --------------------------------------------------------------------------------------------

def sections_of(result: Any) -> list[rs.Section]:
    """The report sections of any result.

    Raises:
        ConfigError: ``result`` is not a renderable result.
    """
    kind = kind_of(result)
    if kind == "calibration":
        return rs.calibration_sections(result)
    if kind == "sensitivity":
        return rs.sensitivity_sections(result)
    if kind == "fallback":
        return rs.fallback_sections(result)
    if kind == "lint":
        return rs.lint_sections(result)
    if kind == "doctor":
        return rs.doctor_sections(result)
    # In a bundle, the layers a fallback plan keeps out of INT8 are marked on the ranking charts.
    kept = tuple(node for r in result.results if kind_of(r) == "fallback" for node in r.nodes)

    def member(item: Any) -> list[rs.Section]:
        if kept and kind_of(item) == "sensitivity":
            return rs.sensitivity_sections(item, highlight=kept)
        return sections_of(item)

    return rs.bundle_sections(result, member)


def _title(result: Any, title: str | None) -> str:
    if title:
        return title
    if isinstance(result, ReportBundle):
        return result.title
    return f"quantdbg {kind_of(result)} report"


# --------------------------------------------------------------------------------------------
# HTML
# --------------------------------------------------------------------------------------------

_CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0;color:#1b1b1b;
background:#fafafa}
main{max-width:1100px;margin:0 auto;padding:1.5rem 2rem 4rem;background:#fff}
h1{font-size:1.6rem;margin-bottom:.2rem}
h2{margin-top:2.2rem;border-bottom:1px solid #ddd;padding-bottom:.2rem}
h3{margin-top:1.6rem}p.meta{color:#666;margin-top:0}nav ul{columns:2;font-size:.9rem}
table{border-collapse:collapse;margin:.6rem 0 1rem;font-size:.85rem;display:block;overflow-x:auto}
th,td{border:1px solid #ddd;padding:.25rem .5rem;text-align:left;vertical-align:top}
th{background:#f0f0f0}td.num{text-align:right;font-variant-numeric:tabular-nums}
caption{text-align:left;color:#555;padding:.2rem 0}figure{margin:1rem 0}figure img{max-width:100%}
figcaption{color:#555;font-size:.85rem}pre{background:#f4f4f4;padding:.6rem;overflow-x:auto}
p.note{color:#777;font-size:.85rem}li.toc3{margin-left:1.2rem;font-size:.85rem}
"""
_CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'"


def _cell_html(value: Any) -> str:
    from quantdbg.diagnostics import format_cell

    numeric = isinstance(value, (int, float)) and not isinstance(value, bool)
    text = html.escape(format_cell(value))
    return f'<td class="num">{text}</td>' if numeric else f"<td>{text}</td>"


def _table_html(table: rs.Table, seen: dict[str, int]) -> str:
    ident = ""
    if table.css_id:  # ids stay unique when a bundle holds two results of one kind
        seen[table.css_id] = seen.get(table.css_id, 0) + 1
        suffix = "" if seen[table.css_id] == 1 else f"-{seen[table.css_id]}"
        ident = f' id="{html.escape(table.css_id)}{suffix}"'
    caption = f"<caption>{html.escape(table.caption)}</caption>" if table.caption else ""
    head = "".join(f"<th>{html.escape(c)}</th>" for c in table.columns)
    body = "".join("<tr>" + "".join(_cell_html(v) for v in row) + "</tr>" for row in table.rows[:rs.MAX_ROWS])
    more = (f'<p class="note">{len(table.rows) - rs.MAX_ROWS} more row(s) in the JSON report.</p>'
            if len(table.rows) > rs.MAX_ROWS else "")
    return f"<table{ident}>{caption}<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>{more}"


def _plot_html(plot: rs.Plot) -> str:
    data = base64.b64encode(plot.draw()).decode("ascii")
    return (f'<figure><img src="data:image/png;base64,{data}" alt="{html.escape(plot.alt)}">'
            f"<figcaption>{html.escape(plot.title)}</figcaption></figure>")


def _anchors(sections: Sequence[rs.Section]) -> list[str]:
    """One unique fragment per section (titles can repeat across a bundle's results)."""
    seen: dict[str, int] = {}
    out = []
    for section in sections:
        base = section.anchor
        seen[base] = seen.get(base, 0) + 1
        out.append(base if seen[base] == 1 else f"{base}-{seen[base]}")
    return out


def _section_html(section: rs.Section, anchor: str, plots: bool, seen: dict[str, int]) -> str:
    tag = f"h{min(max(section.level, 2), 4)}"
    parts = [f'<section id="{anchor}"><{tag}>{html.escape(section.title)}</{tag}>']
    parts += [f"<p>{html.escape(p)}</p>" for p in section.paragraphs]
    if plots:
        parts += [_plot_html(p) for p in section.plots]
    elif section.plots:
        parts.append('<p class="note">Plots omitted (install quantdbg[report] for matplotlib).</p>')
    if section.code:
        parts.append("<pre>" + html.escape("\n".join(section.code)) + "</pre>")
    parts += [_table_html(t, seen) for t in section.tables]
    return "".join(parts) + "</section>"


def _body_html(sections: Sequence[rs.Section], plots: bool) -> str:
    seen: dict[str, int] = {}
    pairs = zip(sections, _anchors(sections), strict=True)
    return "\n".join(_section_html(s, a, plots, seen) for s, a in pairs)


def render_html(result: Any, *, title: str | None = None, plots: bool = True) -> str:
    """A self-contained HTML page: plots as embedded PNG, no scripts, no external resources.

    Args:
        result: Any renderable result (see the module doc).
        title: Page title (default: from the result).
        plots: Draw the plots (needs matplotlib).

    Returns:
        The HTML text.

    Raises:
        ConfigError: ``result`` is not renderable.
        MissingDependencyError: ``plots`` is set and matplotlib is not installed.
    """

    sections = sections_of(result)
    if plots:
        load("matplotlib", "report")
    page_title = _title(result, title)
    toc = "".join(f'<li class="toc{s.level}"><a href="#{a}">{html.escape(s.title)}</a></li>'
                  for s, a in zip(sections, _anchors(sections), strict=True) if s.level <= 3)
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{_CSP}">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{html.escape(page_title)}</title><style>{_CSS}</style></head>\n<body><main>"
        f'<h1>{html.escape(page_title)}</h1><p class="meta">quantdbg {__version__}</p>'
        f"<nav><ul>{toc}</ul></nav>\n{_body_html(sections, plots)}\n</main></body></html>\n")


def repr_html(result: Any) -> str:
    """An HTML fragment for notebooks (``_repr_html_``): plots when matplotlib is installed.

    Args:
        result: Any renderable result.

    Returns:
        HTML without ``<html>``/``<head>``, safe to embed.
    """
    return f'<div class="quantdbg-report">{_body_html(sections_of(result), is_available("matplotlib"))}</div>'


# --------------------------------------------------------------------------------------------
# Markdown
# --------------------------------------------------------------------------------------------

def _md_cell(value: Any) -> str:
    from quantdbg.diagnostics import format_cell

    return format_cell(value).replace("|", "\\|").replace("\n", " ")


def _table_md(table: rs.Table) -> list[str]:
    lines = [table.caption, ""] if table.caption else []
    lines += ["| " + " | ".join(_md_cell(c) for c in table.columns) + " |",
              "|" + "|".join("---" for _ in table.columns) + "|"]
    lines += ["| " + " | ".join(_md_cell(v) for v in row) + " |" for row in table.rows[:rs.MAX_ROWS]]
    if len(table.rows) > rs.MAX_ROWS:
        lines += ["", f"_{len(table.rows) - rs.MAX_ROWS} more row(s) in the JSON report._"]
    return lines + [""]


def render_markdown(result: Any, *, title: str | None = None) -> str:
    """The report as Markdown: headings, paragraphs, tables and commands (plots are HTML-only).

    Raises:
        ConfigError: ``result`` is not renderable.
    """
    lines = [f"# {_title(result, title)}", ""]
    for section in sections_of(result):
        lines += ["#" * min(max(section.level, 2), 4) + " " + section.title, ""]
        for paragraph in section.paragraphs:
            lines += [paragraph, ""]
        for plot in section.plots:
            lines += [f"_Plot in the HTML report: {plot.title}._", ""]
        if section.code:
            lines += ["```", *section.code, "```", ""]
        for table in section.tables:
            lines += _table_md(table)
    return "\n".join(lines).rstrip() + "\n"


# --------------------------------------------------------------------------------------------
# Files and DataFrames
# --------------------------------------------------------------------------------------------

def write_report(result: Any, *, html: str | os.PathLike | None = None,
                 markdown: str | os.PathLike | None = None, json: str | os.PathLike | None = None,
                 title: str | None = None, plots: bool = True) -> WrittenReport:
    """Writes the requested formats, each atomically; nothing else is written.

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
        ConfigError: Nothing to write, a folder does not exist, or ``result`` is not renderable.
        MissingDependencyError: HTML plots need matplotlib.
    """
    if html is None and markdown is None and json is None:
        raise ConfigError("write_report() needs at least one of html=, markdown= or json= (a path).")
    written: dict[str, Path] = {}
    if json is not None:
        written["json"] = write_text_atomic(json, render_json(result))
    if markdown is not None:
        written["markdown"] = write_text_atomic(markdown, render_markdown(result, title=title))
    if html is not None:
        written["html"] = write_text_atomic(html, render_html(result, title=title, plots=plots))
    return WrittenReport(**written)


def to_dataframe(result: Any) -> Any:
    """The result's main table as a pandas DataFrame (raw values, every row).

    The main table: calibration ranges, sensitivity ranking, fallback evaluations, lint findings,
    doctor findings, or a bundle's summary.

    Raises:
        MissingDependencyError: pandas is not installed (extra ``report``).
        ConfigError: ``result`` is not renderable or has no main table.
    """
    pandas = load("pandas", "report")
    wanted = _PRIMARY[kind_of(result)]
    for section in sections_of(result):
        for table in section.tables:
            if table.css_id == wanted:
                return pandas.DataFrame(list(table.rows), columns=list(table.columns))
    raise ConfigError(f"This {type(result).__name__} has no {wanted!r} table to turn into a DataFrame.")
