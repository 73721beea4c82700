"""``percentile``: the smallest clip that keeps a given fraction of |x| unclipped."""
from __future__ import annotations

import numpy as np

from quantdbg._calibrator_specs import PercentileConfig
from quantdbg.calibration.calibrators.base import HistogramCalibrator, register_calibrator
from quantdbg.calibration.stats import TensorStats


@register_calibrator("percentile", config=PercentileConfig)
class PercentileCalibrator(HistogramCalibrator):
    """``amax`` = upper edge of the first bin where the |x| CDF reaches ``percentile`` %.

    Taking the upper edge guarantees that at least ``percentile`` % of the values lie inside
    ``[-amax, amax]``; the result never exceeds max |x| (so ``percentile=100`` is ``minmax``).
    """

    def compute_amax(self, stats: TensorStats) -> float:
        """Returns the percentile clip."""
        hist = self.binned(stats)
        return min(percentile_edge(hist.counts, self.config.percentile) * hist.width, stats.absmax)


def percentile_edge(counts: np.ndarray, percentile: float) -> int:
    """Index of the upper edge of the first bin whose cumulative count reaches ``percentile`` %.

    Args:
        counts: Histogram counts (total > 0).
        percentile: In (0, 100].

    Returns:
        ``i + 1`` for the first bin ``i`` with ``cumsum(counts)[i] >= total * percentile / 100``.
    """
    cumulative = np.cumsum(counts, dtype=np.int64)
    need = float(cumulative[-1]) * percentile / 100.0
    index = int(np.searchsorted(cumulative.astype(np.float64), need, side="left"))
    return min(index, counts.shape[0] - 1) + 1
