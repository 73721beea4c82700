"""Every calibrator measured on the same statistics: the clip each chooses and the error it gives.

:func:`compare_calibrators` is calibration maths, computed where an analysis asks for it (the
doctor's calibrator check does); a report renders a comparison only when a result holds one.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

import numpy as np

from quantdbg._json import Serializable
from quantdbg.calibration.calibrators.base import calibrator_amaxes
from quantdbg.calibration.ranges import CalibrationResult
from quantdbg.calibration.stats import TensorStats
from quantdbg.errors import NotCalibratedError
from quantdbg.quant_math import QMAX, sqnr_db

PLOT_BINS = 256
"""Histogram resolution kept for plots (the collected histograms have tens of thousands of bins)."""


@dataclass(frozen=True)
class CalibratorComparison(Serializable):
    """Every calibrator's clip for one activation tensor, and the error each gives.

    Attributes:
        tensor: ONNX value name.
        chosen: The calibrator the Q/DQ model uses.
        amax: Calibrator -> clip.
        tensor_sqnr: Calibrator -> SQNR (dB) of the tensor itself quantized with that clip,
            computed from its calibration histogram.
        layer_sqnr: Calibrator -> the worst consumer layer's local output SQNR (dB) with that clip
            (from sensitivity evidence; empty when not measured).
        best: The calibrator with the highest layer SQNR (tensor SQNR when no layer SQNR).
        ratio: Largest clip / smallest clip.
        hist: |x| histogram at plot resolution (ends at max|x|).
        hist_width: Its bin width.
    """

    tensor: str
    chosen: str
    amax: Mapping[str, float]
    tensor_sqnr: Mapping[str, float]
    layer_sqnr: Mapping[str, float]
    best: str
    ratio: float
    hist: tuple[int, ...] = ()
    hist_width: float = 0.0

    def __post_init__(self) -> None:
        for name in ("amax", "tensor_sqnr", "layer_sqnr"):
            object.__setattr__(self, name, MappingProxyType(dict(getattr(self, name))))

    @property
    def gain_db(self) -> float:
        """How much better the best calibrator is than the chosen one (dB, by the deciding SQNR)."""
        sqnr = self.layer_sqnr or self.tensor_sqnr
        if self.chosen not in sqnr or self.best not in sqnr:
            return 0.0
        return float(sqnr[self.best] - sqnr[self.chosen])


def histogram_sqnr(stats: TensorStats, amax: float) -> float:
    """SQNR (dB) of a tensor quantized to symmetric INT8 with clip ``amax``, from its |x| histogram.

    Each bin's values are taken as spread evenly over the bin: values below half a step round to
    0 (error: their own square), values beyond ``amax`` saturate (error: distance to ``amax``),
    the rest get the uniform rounding error ``step**2 / 12``.

    Args:
        stats: Statistics with a histogram.
        amax: The clip.

    Returns:
        The SQNR in dB (+inf for an all-zero tensor).

    Raises:
        NotCalibratedError: ``stats`` has no histogram.
    """
    if stats.hist is None or stats.hist_range is None:
        raise NotCalibratedError(f"Tensor {stats.name!r} has no histogram; collect it with histogram=True.")
    counts = np.asarray(stats.hist, np.float64)
    width = stats.hist_range / counts.size
    lo = np.arange(counts.size) * width
    hi = lo + width
    mean_sq = (lo * lo + lo * hi + hi * hi) / 3.0  # E[x^2] over a uniform bin
    step = amax / QMAX
    center = lo + width / 2
    clipped = (center - amax) ** 2 + width * width / 12.0
    error = np.where(hi <= step / 2, mean_sq, np.where(center <= amax, step * step / 12.0, clipped))
    return sqnr_db(float((counts * mean_sq).sum()), float((counts * error).sum()))


def _nan_last(value: float) -> float:
    """Orders SQNRs with NaN below every number (so a NaN is never the best)."""
    return -math.inf if math.isnan(value) else value


LayerSqnr = Mapping[str, Mapping[str, float]]
"""Tensor -> calibrator -> SQNR (dB) of the tensor's consumer layers with that calibrator's clip."""


def compare_calibrators(calibration: CalibrationResult,
                        layer_sqnr: LayerSqnr | None = None) -> list[CalibratorComparison]:
    """Measures every registered calibrator on every activation tensor that has a histogram.

    Args:
        calibration: Ranges and statistics (histograms are needed).
        layer_sqnr: Tensor -> calibrator -> its consumer layers' worst local output SQNR (dB),
            e.g. from sensitivity evidence; where given, it decides the best calibrator.

    Returns:
        One comparison per tensor, in calibration order.
    """
    found = []
    for tensor, chosen in calibration.ranges.items():
        stats = calibration.stats.get(tensor)
        if stats is None or stats.hist is None or stats.absmax == 0.0:
            continue
        amax = calibrator_amaxes(stats)
        if not amax:
            continue
        tensor_sqnr = {name: histogram_sqnr(stats, value) for name, value in amax.items()}
        by_layer = dict((layer_sqnr or {}).get(tensor, {}))
        deciding = by_layer or tensor_sqnr
        best = max(sorted(deciding), key=lambda k: _nan_last(deciding[k]))
        plot = stats.binned(PLOT_BINS)
        found.append(CalibratorComparison(
            tensor, chosen.method, amax, tensor_sqnr, by_layer, best,
            max(amax.values()) / max(min(amax.values()), 1e-30), tuple(int(c) for c in plot.counts),
            float(plot.width)))
    return found
