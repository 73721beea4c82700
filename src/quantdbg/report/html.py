"""HTML reports: one self-contained page, plots embedded as base64 PNG, no script, no network access.

A Content-Security-Policy forbids any load but inline styles and ``data:`` images. Notebooks get
the same sections as a fragment (:func:`repr_html`).
"""
from __future__ import annotations

import base64
import html
from collections.abc import Sequence
from typing import Any

from quantdbg._optional import is_available, load
from quantdbg._version import __version__
from quantdbg.diagnostics.findings import Cell, format_cell
from quantdbg.report.results import report_title
from quantdbg.report.sections.base import MAX_ROWS, Plot, Section, Table
from quantdbg.report.sections.registry import sections_of

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
div.lead{border:1px solid #c9d6e8;background:#f5f8fc;padding:.2rem 1rem .6rem;margin:.6rem 0 1rem}
div.lead h2{margin-top:.6rem;border:0}div.lead h3{margin:.6rem 0 .2rem}
div.lead p:first-of-type{font-weight:600}
div.lead li{margin:.15rem 0}div.lead pre{white-space:pre-wrap;word-break:break-all;font-size:.8rem}
"""
_CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'"


def _cell_html(value: Cell) -> str:
    numeric = isinstance(value, (int, float)) and not isinstance(value, bool)
    text = html.escape(format_cell(value))
    return f'<td class="num">{text}</td>' if numeric else f"<td>{text}</td>"


def _table_html(table: Table, seen: dict[str, int]) -> str:
    ident = ""
    if table.css_id:  # ids stay unique when a bundle holds two results of one kind
        seen[table.css_id] = seen.get(table.css_id, 0) + 1
        suffix = "" if seen[table.css_id] == 1 else f"-{seen[table.css_id]}"
        ident = f' id="{html.escape(table.css_id)}{suffix}"'
    caption = f"<caption>{html.escape(table.caption)}</caption>" if table.caption else ""
    head = "".join(f"<th>{html.escape(c)}</th>" for c in table.columns)
    body = "".join("<tr>" + "".join(_cell_html(v) for v in row) + "</tr>" for row in table.rows[:MAX_ROWS])
    more = (f'<p class="note">{len(table.rows) - MAX_ROWS} more row(s) in the JSON report.</p>'
            if len(table.rows) > MAX_ROWS else "")
    return f"<table{ident}>{caption}<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>{more}"


def _plot_html(plot: Plot) -> str:
    data = base64.b64encode(plot.draw()).decode("ascii")
    return (f'<figure><img src="data:image/png;base64,{data}" alt="{html.escape(plot.alt)}">'
            f"<figcaption>{html.escape(plot.title)}</figcaption></figure>")


def _item_html(item: str) -> str:
    """A list item; the text before a first ': ' (a layer or a flag) in bold."""
    head, sep, tail = item.partition(": ")
    if not sep or len(head) > 80:
        return html.escape(item)
    return f"<strong>{html.escape(head)}</strong>: {html.escape(tail)}"


def _anchors(sections: Sequence[Section]) -> list[str]:
    """One unique fragment per section (titles can repeat across a bundle's results)."""
    seen: dict[str, int] = {}
    out = []
    for section in sections:
        base = section.anchor
        seen[base] = seen.get(base, 0) + 1
        out.append(base if seen[base] == 1 else f"{base}-{seen[base]}")
    return out


def _section_html(section: Section, anchor: str, plots: bool, seen: dict[str, int]) -> str:
    tag = f"h{min(max(section.level, 2), 4)}"
    parts = [f'<section id="{anchor}"><{tag}>{html.escape(section.title)}</{tag}>']
    parts += [f"<p>{html.escape(p)}</p>" for p in section.paragraphs]
    if section.items:
        parts.append("<ul>" + "".join(f"<li>{_item_html(i)}</li>" for i in section.items) + "</ul>")
    if plots:
        parts += [_plot_html(p) for p in section.plots]
    elif section.plots:
        parts.append('<p class="note">Plots omitted (install quantdbg[report] for matplotlib).</p>')
    if section.code:
        parts.append("<pre>" + html.escape("\n".join(section.code)) + "</pre>")
    parts += [_table_html(t, seen) for t in section.tables]
    return "".join(parts) + "</section>"


def _body_html(sections: Sequence[Section], plots: bool, toc: str = "") -> str:
    """The sections; the lead ones (the first screen) boxed before ``toc``."""
    seen: dict[str, int] = {}
    pairs = list(zip(sections, _anchors(sections), strict=True))
    lead = "".join(_section_html(s, a, plots, seen) for s, a in pairs if s.lead)
    rest = "\n".join(_section_html(s, a, plots, seen) for s, a in pairs if not s.lead)
    return (f'<div class="lead">{lead}</div>' if lead else "") + toc + "\n" + rest


def render_html(result: Any, *, title: str | None = None, plots: bool = True) -> str:
    """A self-contained HTML page: plots as embedded PNG, no scripts, no external resources.

    Args:
        result: Any renderable result (see :mod:`quantdbg.report.results`).
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
    page_title = report_title(result, title)
    toc = "".join(f'<li class="toc{s.level}"><a href="#{a}">{html.escape(s.title)}</a></li>'
                  for s, a in zip(sections, _anchors(sections), strict=True) if s.level <= 3 and not s.lead)
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{_CSP}">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{html.escape(page_title)}</title><style>{_CSS}</style></head>\n<body><main>"
        f'<h1>{html.escape(page_title)}</h1><p class="meta">quantdbg {__version__}</p>'
        f"{_body_html(sections, plots, f'<nav><ul>{toc}</ul></nav>')}\n</main></body></html>\n")


_FRAGMENT_CSS = ("<style>.quantdbg-report div.lead{border:1px solid #c9d6e8;padding:0 .8rem .4rem;"
                 "margin:.4rem 0}</style>")


def sections_html(sections: Sequence[Section]) -> str:
    """An HTML fragment of ``sections`` (plots when matplotlib is installed), for notebooks."""
    body = _body_html(sections, is_available("matplotlib"))
    return f'<div class="quantdbg-report">{_FRAGMENT_CSS}{body}</div>'


def repr_html(result: Any) -> str:
    """An HTML fragment for notebooks (``_repr_html_``): plots when matplotlib is installed.

    Args:
        result: Any renderable result.

    Returns:
        HTML without ``<html>``/``<head>``, safe to embed.
    """
    return sections_html(sections_of(result))
