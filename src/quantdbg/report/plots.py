"""The report's plots: matplotlib figures, and :func:`png` to turn one into PNG bytes.

matplotlib is an optional dependency (extra ``report``) and is imported on first use. Figures are
built with the object-oriented API on an Agg canvas, never through ``pyplot``, so drawing a report
neither switches a notebook's backend nor leaves figures open. PNGs carry no timestamp or version
metadata, so the same data gives the same bytes.
"""
from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from quantdbg._optional import load

_COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf")
_DPI = 96


@dataclass(frozen=True)
class ThresholdHistogram:
    """One tensor's |x| histogram and the clip each calibrator would choose.

    Attributes:
        tensor: ONNX value name.
        counts: Counts of |x| per bin, from 0.
        width: Bin width.
        thresholds: Calibrator name -> amax.
        chosen: The calibrator actually used (drawn solid), or None.
    """

    tensor: str
    counts: Sequence[int]
    width: float
    thresholds: Mapping[str, float]
    chosen: str | None = None


@dataclass(frozen=True)
class ScaleCurve:
    """Scale of one tensor as the number of calibration samples grows (bootstrap band).

    Attributes:
        tensor: ONNX value name.
        n_samples: Sample counts, ascending.
        median: Median scale over bootstrap rounds at each count.
        lo: Lower band (e.g. 10th percentile) at each count.
        hi: Upper band at each count.
    """

    tensor: str
    n_samples: Sequence[int]
    median: Sequence[float]
    lo: Sequence[float]
    hi: Sequence[float]


def _figure(width: float, height: float, layout: str | None = "constrained") -> Any:
    figure_mod = load("matplotlib.figure", "report")
    load("matplotlib.backends.backend_agg", "report")  # the canvas savefig() draws on
    return figure_mod.Figure(figsize=(width, height), dpi=_DPI, layout=layout)


def png(fig: Any) -> bytes:
    """A figure as PNG bytes, without metadata (the same figure gives the same bytes).

    Args:
        fig: A matplotlib Figure from one of this module's ``*_figure`` functions.

    Returns:
        The PNG file's bytes.
    """
    buffer = io.BytesIO()
    # No "Software"/date metadata: identical data gives identical bytes.
    fig.savefig(buffer, format="png", dpi=_DPI, metadata={"Software": None})
    return buffer.getvalue()


def _short(name: str, limit: int = 42) -> str:
    return name if len(name) <= limit else "..." + name[-(limit - 3):]


def ranking_figure(names: Sequence[str], values: Sequence[float], xlabel: str,
                   title: str = "Layer sensitivity (most sensitive on top)",
                   highlight: Sequence[str] = ()) -> Any:
    """Horizontal bar chart of per-layer scores, in the given (ranked) order.

    Args:
        names: Layer names, most sensitive first.
        values: One score per layer (e.g. the output SQNR drop in dB).
        xlabel: What the score is.
        title: Figure title.
        highlight: Layers to colour differently (e.g. the ones the fallback plan keeps out of INT8).

    Returns:
        The matplotlib Figure (see :func:`png`).
    """
    n = len(names)
    fig = _figure(7.5, max(2.0, 0.32 * n + 1.0))
    ax = fig.add_subplot()
    marked = set(highlight)
    colors = [_COLORS[1] if name in marked else _COLORS[0] for name in names]
    raw = np.asarray(values, dtype=np.float64)
    finite = np.nan_to_num(raw, nan=0.0, posinf=0.0, neginf=0.0)
    ax.barh(np.arange(n), finite, color=colors)
    # Each bar carries its value, so a zero-length (or non-finite) bar still shows it was measured.
    ax.scatter(np.zeros(n), np.arange(n), marker="|", s=80, color=colors, zorder=3)
    for i, (bar, value) in enumerate(zip(finite, raw, strict=True)):
        ax.annotate(f"{value:.3g}" if np.isfinite(value) else "n/a", (max(bar, 0.0), i),
                    textcoords="offset points", xytext=(3, 0), va="center", fontsize=7)
    ax.margins(x=0.08)
    ax.set_yticks(np.arange(n), [_short(name) for name in names], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel(xlabel)
    ax.set_title(title, fontsize=10)
    ax.grid(axis="x", alpha=0.3)
    if marked:
        ax.legend(handles=[_patch(_COLORS[1], "kept out of INT8"), _patch(_COLORS[0], "INT8")],
                  fontsize=8, loc="lower right")
    return fig


def _patch(color: str, label: str) -> Any:
    patches = load("matplotlib.patches", "report")
    return patches.Patch(color=color, label=label)


def threshold_figure(items: Sequence[ThresholdHistogram], columns: int = 2) -> Any:
    """Per-tensor |x| histograms (log counts) with every calibrator's clip drawn as a line.

    Args:
        items: One panel per tensor.
        columns: Panels per row.

    Returns:
        The matplotlib Figure (see :func:`png`).
    """
    rows = max(1, -(-len(items) // columns))
    # A fixed grid: constrained layout re-measures every log-axis tick label and takes seconds here.
    fig = _figure(4.2 * columns, 2.7 * rows + 0.5, layout=None)
    fig.subplots_adjust(left=0.1, right=0.98, bottom=0.06, top=1 - 0.5 / (2.7 * rows + 0.5),
                        hspace=0.55, wspace=0.3)
    axes = fig.subplots(rows, columns, squeeze=False)
    ticker = load("matplotlib.ticker", "report")
    methods = sorted({m for item in items for m in item.thresholds})
    color_of = {m: _COLORS[i % len(_COLORS)] for i, m in enumerate(methods)}
    for ax, item in zip(axes.flat, items, strict=False):
        counts = np.asarray(item.counts, dtype=np.float64)
        edges = np.arange(counts.size + 1) * item.width
        ax.stairs(np.maximum(counts, 0.5), edges, fill=True, color="#bbbbbb", baseline=0.5)
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(ticker.LogLocator(numticks=4))
        ax.yaxis.set_minor_locator(ticker.NullLocator())
        for method, amax in item.thresholds.items():
            style = "-" if method == item.chosen else "--"
            ax.axvline(amax, color=color_of[method], linestyle=style, linewidth=1.4, label=method)
        ax.set_title(_short(item.tensor, 48), fontsize=8)
        ax.set_xlabel("|x|", fontsize=8)
        ax.set_ylabel("values per bin (log)", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.set_xlim(0, max(edges[-1], max(item.thresholds.values(), default=0.0)) * 1.03)
    for ax in list(axes.flat)[len(items):]:
        ax.set_visible(False)
    handles = [load("matplotlib.lines", "report").Line2D([], [], color=color_of[m], label=m) for m in methods]
    if handles:
        fig.legend(handles=handles, loc="upper center", ncols=len(handles), fontsize=8, frameon=False)
    return fig


def weight_zeroing_figure(nodes: Sequence[str], per_tensor: Sequence[float],
                          per_channel: Sequence[float]) -> Any:
    """Share of non-zero weights that quantize to 0, per node, per-tensor vs per-channel scale.

    Args:
        nodes: Node names.
        per_tensor: Fraction zeroed with one scale for the whole weight.
        per_channel: Fraction zeroed with one scale per output channel.

    Returns:
        The matplotlib Figure (see :func:`png`).
    """
    n = len(nodes)
    fig = _figure(7.5, max(2.0, 0.36 * n + 1.2))
    ax = fig.add_subplot()
    y = np.arange(n)
    ax.barh(y - 0.2, 100 * np.asarray(per_tensor, dtype=np.float64), height=0.4, color=_COLORS[1],
            label="per-tensor scale")
    ax.barh(y + 0.2, 100 * np.asarray(per_channel, dtype=np.float64), height=0.4, color=_COLORS[0],
            label="per-channel scale")
    ax.set_yticks(y, [_short(node) for node in nodes], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("non-zero weights that round to 0 in INT8 (%)")
    ax.set_title("Weights zeroed per node", fontsize=10)
    ax.legend(fontsize=8, loc="lower right")
    ax.grid(axis="x", alpha=0.3)
    return fig


def scale_curves_figure(curves: Sequence[ScaleCurve], columns: int = 4) -> Any:
    """Scale relative to the full-set scale against the number of calibration samples: one small
    panel per tensor (bands drawn together hide each other), on shared axes.

    Args:
        curves: One curve per tensor; each is normalised by its own last median.
        columns: Panels per row.

    Returns:
        The matplotlib Figure (see :func:`png`).
    """
    columns = max(1, min(columns, len(curves)))
    rows = max(1, -(-len(curves) // columns))
    fig = _figure(1.9 * columns + 0.8, 1.7 * rows + 0.9)
    axes = fig.subplots(rows, columns, squeeze=False, sharex=True, sharey=True)
    for i, (ax, curve) in enumerate(zip(axes.flat, curves, strict=False)):
        ref = float(curve.median[-1]) or 1.0
        n = np.asarray(curve.n_samples, dtype=np.float64)
        color = _COLORS[i % len(_COLORS)]
        ax.fill_between(n, np.asarray(curve.lo) / ref, np.asarray(curve.hi) / ref, color=color, alpha=0.25,
                        linewidth=0)
        ax.plot(n, np.asarray(curve.median) / ref, marker="o", markersize=3, color=color)
        ax.axhline(1.0, color="#666666", linewidth=0.8)
        ax.set_xscale("log", base=2)
        ax.set_title(_short(curve.tensor, 28), fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(curves):]:
        ax.set_visible(False)
    fig.supxlabel("calibration samples (log scale)", fontsize=9)
    fig.supylabel("scale / scale with all samples", fontsize=9)
    fig.suptitle("Scale against number of calibration samples (median, bootstrap 10-90 % band)", fontsize=10)
    return fig


def _point_labels(sizes: np.ndarray, values: np.ndarray) -> list[tuple[float, float, str]]:
    """One label per drawn point: evaluations landing on the same spot (same size, values within 1 %
    of the axis span) share a label such as ``2, 4``, so no two labels overlap there."""
    span = float(np.nanmax(values) - np.nanmin(values)) if np.isfinite(values).any() else 0.0
    tol = 0.01 * span if span > 0 else 1e-9
    groups: list[tuple[float, float, list[int]]] = []
    for i, (x, v) in enumerate(zip(sizes, values, strict=True)):
        for gx, gv, members in groups:
            if gx == x and (abs(gv - v) <= tol or (np.isnan(gv) and np.isnan(v))):
                members.append(i + 1)
                break
        else:
            groups.append((float(x), float(v), [i + 1]))
    return [(x, v, ", ".join(map(str, members))) for x, v, members in groups]


def fallback_figure(sizes: Sequence[int], values: Sequence[float], met: Sequence[bool], threshold: float,
                    ylabel: str) -> Any:
    """Every evaluation of a fallback search: metric against number of layers kept out of INT8.

    Args:
        sizes: Number of layers kept out of INT8 in each evaluation, in order.
        values: The metric of each evaluation.
        met: Whether each met the target.
        threshold: The target's bound (drawn as a line).
        ylabel: The metric, with its unit (e.g. ``output SQNR (dB)``).

    Returns:
        The matplotlib Figure (see :func:`png`).
    """
    fig = _figure(6.0, 3.2)
    ax = fig.add_subplot()
    sizes_arr = np.asarray(sizes, dtype=np.float64)
    vals = np.asarray(values, dtype=np.float64)
    ok = np.asarray(met, dtype=bool)
    ax.plot(sizes_arr, vals, color="#999999", linewidth=0.8, zorder=1)
    ax.scatter(sizes_arr[ok], vals[ok], color=_COLORS[2], label="meets target", zorder=2)
    ax.scatter(sizes_arr[~ok], vals[~ok], color=_COLORS[1], label="misses target", zorder=2)
    for j, (x, v, label) in enumerate(_point_labels(sizes_arr, vals)):
        # Alternate sides so labels of neighbouring points do not run into each other.
        offset = (5, 4) if j % 2 == 0 else (5, -10)
        ax.annotate(label, (x, v), textcoords="offset points", xytext=offset, fontsize=7)
    ax.axhline(threshold, color="#333333", linestyle="--", linewidth=1, label="target")
    ax.xaxis.set_major_locator(load("matplotlib.ticker", "report").MaxNLocator(integer=True))
    ax.margins(x=0.1)
    ax.set_xlabel("layers kept out of INT8 (count)")
    ax.set_ylabel(ylabel)
    ax.set_title("Fallback search: evaluations in order (labels: evaluation number)", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return fig
