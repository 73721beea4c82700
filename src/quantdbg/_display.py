"""The display hook: results ask here for their short repr, notebook HTML and DataFrame; the report
package answers.

A result type lower in the pipeline (a calibration, a lint report) must not import the report
package, which sits above it and imports it back. So a result's ``_repr_html_`` calls
:func:`html`, which looks up the renderer registered for the result's type. Renderers are
registered by the modules named in :func:`add_provider`; the package facade names
``quantdbg.report.display`` once, and the first lookup imports it (the way IPython's formatters
or entry points work). Rendering only formats what the result already holds.
"""
from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

Renderer = Callable[[Any], Any]

_HTML: dict[type, Renderer] = {}
_FRAMES: dict[type, Renderer] = {}
_TEXTS: dict[type, Renderer] = {}
_MARKDOWN: dict[type, Renderer] = {}
MAX_REPR = 400
"""Longest short repr (a result's full content is in its JSON, HTML and DataFrame)."""
_PROVIDERS: list[str] = []
_LOADED: set[str] = set()


def add_provider(module: str) -> None:
    """Names a module that registers renderers when imported (imported on the first lookup)."""
    if module not in _PROVIDERS:
        _PROVIDERS.append(module)


def register(cls: type, *, html: Renderer | None = None, frame: Renderer | None = None,
             text: Renderer | None = None, markdown: Renderer | None = None) -> None:
    """Registers the HTML, DataFrame, short-repr and/or Markdown renderer of a result type."""
    for table, renderer in ((_HTML, html), (_FRAMES, frame), (_TEXTS, text), (_MARKDOWN, markdown)):
        if renderer is not None:
            table[cls] = renderer


def _lookup(table: dict[type, Renderer], obj: Any) -> Renderer | None:
    for module in _PROVIDERS:
        if module not in _LOADED:
            _LOADED.add(module)
            importlib.import_module(module)
    for cls in type(obj).__mro__:
        if cls in table:
            return table[cls]
    return None


def html(obj: Any) -> str:
    """The notebook HTML of a result (a plain ``<pre>`` of its repr when no renderer is registered)."""
    renderer = _lookup(_HTML, obj)
    if renderer is None:
        import html as escape

        return f"<pre>{escape.escape(repr(obj))}</pre>"
    return str(renderer(obj))


def text(obj: Any) -> str:
    """A result's short repr (one line of its key facts, at most :data:`MAX_REPR` characters)."""
    renderer = _lookup(_TEXTS, obj)
    found = f"{type(obj).__name__}(...)" if renderer is None else str(renderer(obj))
    return found if len(found) <= MAX_REPR else found[:MAX_REPR - 4] + " ...)"


def frame(obj: Any) -> Any:
    """The pandas DataFrame of a result.

    Raises:
        TypeError: No DataFrame renderer is registered for its type.
    """
    renderer = _lookup(_FRAMES, obj)
    if renderer is None:
        raise TypeError(f"{type(obj).__name__} has no DataFrame form.")
    return renderer(obj)


def markdown(obj: Any) -> str:
    """The Markdown report of a result.

    Raises:
        TypeError: No Markdown renderer is registered for its type.
    """
    renderer = _lookup(_MARKDOWN, obj)
    if renderer is None:
        raise TypeError(f"{type(obj).__name__} has no Markdown form.")
    return str(renderer(obj))


class Displayable:
    """Gives a result its short ``__repr__``, ``_repr_html_``, ``to_dataframe()`` and ``to_markdown()``
    through this hook.

    A dataclass using it passes ``repr=False``, or the generated field dump would replace the short
    repr.
    """

    __slots__ = ()

    def __repr__(self) -> str:
        return text(self)

    def _repr_html_(self) -> str:
        return html(self)

    def to_dataframe(self) -> Any:
        """The result's main table as a pandas DataFrame (needs the ``report`` extra).

        Raises:
            MissingDependencyError: pandas is not installed.
        """
        return frame(self)

    def to_markdown(self) -> str:
        """The result's Markdown report: the same as :func:`quantdbg.report.render_markdown` (one
        renderer for every Markdown quantdbg writes)."""
        return markdown(self)
