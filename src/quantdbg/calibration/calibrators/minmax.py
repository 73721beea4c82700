"""``minmax``: the range is the largest magnitude seen."""
from __future__ import annotations

from quantdbg._calibrator_specs import MinMaxConfig
from quantdbg.calibration.calibrators.base import Calibrator, register_calibrator
from quantdbg.calibration.stats import TensorStats


@register_calibrator("minmax", config=MinMaxConfig)
class MinMaxCalibrator(Calibrator):
    """``amax = max |x|`` over every finite value seen (needs no histogram)."""

    needs_histogram = False

    def compute_amax(self, stats: TensorStats) -> float:
        """Returns max |x|."""
        return stats.absmax
