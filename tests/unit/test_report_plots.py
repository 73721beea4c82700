"""The report's figures: PNGs that decode, axes labelled as the module sets them, the same bytes for the
same data."""
from __future__ import annotations

import io

import numpy as np
import pytest

mpl_image = pytest.importorskip("matplotlib.image")

from quantdbg.report.plots import (  # noqa: E402
    ScaleCurve,
    ThresholdHistogram,
    fallback_figure,
    png,
    ranking_figure,
    scale_curves_figure,
    threshold_figure,
    weight_zeroing_figure,
)

DPI = 96


def _decoded(data: bytes) -> np.ndarray:
    assert data.startswith(b"\x89PNG\r\n\x1a\n")
    assert b"Software" not in data and b"tIME" not in data  # no metadata, so no timestamp or version
    return mpl_image.imread(io.BytesIO(data), format="png")


def _check_png(fig) -> np.ndarray:
    data = png(fig)
    pixels = _decoded(data)
    width, height = fig.get_size_inches() * DPI
    assert pixels.shape[:2] == (int(height), int(width))  # matplotlib truncates fractional pixels
    return pixels


def test_ranking_figure_labels_bars_and_highlights():
    fig = ranking_figure(["a", "b", "c"], [3.0, np.inf, 1.0], "SQNR drop (dB)", highlight=["b"])
    [ax] = fig.axes
    assert ax.get_xlabel() == "SQNR drop (dB)"
    assert ax.get_title() == "Layer sensitivity (most sensitive on top)"
    assert [t.get_text() for t in ax.get_yticklabels()] == ["a", "b", "c"]
    assert [p.get_width() for p in ax.patches] == [3.0, 0.0, 1.0]  # a non-finite value draws no bar
    # ... but every bar carries its value, so a zero-length one is still seen to be there.
    assert [t.get_text() for t in ax.texts] == ["3", "n/a", "1"]
    assert [t.xy for t in ax.texts] == [(3.0, 0), (0.0, 1), (1.0, 2)]
    assert [label.get_text() for label in ax.get_legend().get_texts()] == ["kept out of INT8", "INT8"]
    assert ax.yaxis_inverted()  # most sensitive on top
    _check_png(fig)


def test_threshold_figure_draws_a_line_per_calibrator():
    items = [ThresholdHistogram("x", [10, 5, 1], 0.5, {"minmax": 1.5, "mse": 1.0}, "mse"),
             ThresholdHistogram("y", [3, 3], 1.0, {"minmax": 2.0}, "minmax"),
             ThresholdHistogram("z", [1], 1.0, {"mse": 0.5})]
    fig = threshold_figure(items, columns=2)
    axes = [ax for ax in fig.axes if ax.get_visible()]
    assert len(axes) == 3 and len(fig.axes) == 4  # a 2 x 2 grid, the empty panel hidden
    assert [ax.get_title() for ax in axes] == ["x", "y", "z"]
    assert all(ax.get_xlabel() == "|x|" and ax.get_yscale() == "log" for ax in axes)
    assert all(ax.get_ylabel() == "values per bin (log)" for ax in axes)
    lines = axes[0].get_lines()
    assert [(line.get_xdata()[0], line.get_linestyle()) for line in lines] == [(1.5, "--"), (1.0, "-")]
    assert axes[0].get_xlim() == pytest.approx((0.0, 1.5 * 1.03))
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["minmax", "mse"]
    _check_png(fig)


def test_weight_zeroing_figure_shows_percentages():
    fig = weight_zeroing_figure(["conv1", "conv2"], [0.5, 0.25], [0.0, 0.125])
    [ax] = fig.axes
    assert ax.get_xlabel() == "non-zero weights that round to 0 in INT8 (%)"
    assert [p.get_width() for p in ax.patches] == [50.0, 25.0, 0.0, 12.5]  # per tensor, then per channel
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["per-tensor scale", "per-channel scale"]
    _check_png(fig)


def test_scale_curves_figure_is_relative_to_the_full_set():
    curve = ScaleCurve("t", [8, 16, 32], [2.0, 3.0, 4.0], [1.0, 2.0, 3.0], [3.0, 4.0, 5.0])
    fig = scale_curves_figure([curve])
    [ax] = fig.axes
    assert fig.get_supxlabel() == "calibration samples (log scale)"
    assert fig.get_supylabel() == "scale / scale with all samples"
    assert ax.get_xscale() == "log" and ax.get_title() == "t"
    median, reference = ax.get_lines()
    assert list(median.get_ydata()) == [0.5, 0.75, 1.0] and list(reference.get_ydata()) == [1.0, 1.0]
    _check_png(fig)


def test_scale_curves_get_a_panel_each_on_shared_axes():
    curves = [ScaleCurve(f"t{i}", [8, 16], [1.0, 1.0], [0.8 - i / 10, 0.9], [1.2, 1.1]) for i in range(7)]
    fig = scale_curves_figure(curves)
    shown = [ax for ax in fig.axes if ax.get_visible()]
    assert [ax.get_title() for ax in shown] == [c.tensor for c in curves] and len(fig.axes) == 8
    assert all(len(ax.collections) == 1 for ax in shown)  # one band per panel: none hides another
    assert len({ax.get_ylim() for ax in shown}) == 1  # comparable at a glance
    _check_png(fig)


def test_fallback_figure_marks_what_meets_the_target():
    fig = fallback_figure([4, 2, 3, 4], [41.0, 35.0, 40.5, 41.0], [True, False, True, True], 40.0,
                          "output SQNR (dB)")
    [ax] = fig.axes
    assert ax.get_xlabel() == "layers kept out of INT8 (count)" and ax.get_ylabel() == "output SQNR (dB)"
    met, missed = ax.collections
    assert met.get_offsets().tolist() == [[4.0, 41.0], [3.0, 40.5], [4.0, 41.0]]
    assert missed.get_offsets().tolist() == [[2.0, 35.0]]
    # Evaluation order; the 4th landed where the 1st did, so they share one label.
    assert [t.get_text() for t in ax.texts] == ["1, 4", "2", "3"]
    assert ax.get_lines()[-1].get_ydata()[0] == 40.0  # the target
    _check_png(fig)
    ticks = [t for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]]
    assert ticks and all(float(t).is_integer() for t in ticks)  # a count has no tick at 2.5


@pytest.mark.parametrize("draw", [
    lambda: ranking_figure(["a", "b"], [2.0, 1.0], "x", highlight=["a"]),
    lambda: threshold_figure([ThresholdHistogram("x", [4, 2, 1], 0.25, {"minmax": 0.75, "mse": 0.5}, "mse")]),
    lambda: scale_curves_figure([ScaleCurve("t", [1, 2], [1.0, 1.0], [0.9, 0.95], [1.1, 1.05])]),
])
def test_the_same_data_gives_the_same_bytes(draw):
    assert png(draw()) == png(draw())
    assert png(draw()) != png(ranking_figure(["other"], [1.0], "y"))
