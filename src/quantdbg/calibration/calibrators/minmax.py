"""``minmax``: the range is the largest magnitude seen."""
from __future__ import annotations

from dataclasses import dataclass

from quantdbg.calibration.calibrators.base import Calibrator, register_calibrator
from quantdbg.calibration.stats import TensorStats


@dataclass(frozen=True)
class MinMaxConfig:
    """``minmax`` has no options; the class exists so the choice can be a config instance."""


@register_calibrator("minmax", config=MinMaxConfig)
class MinMaxCalibrator(Calibrator):
    """``amax = max |x|`` over every finite value seen (needs no histogram)."""

    needs_histogram = False

    def compute_amax(self, stats: TensorStats) -> float:
        """Returns max |x|."""
        return stats.absmax
