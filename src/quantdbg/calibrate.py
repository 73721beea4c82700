"""The calibration pipeline: plan Q/DQ placement, collect statistics, compute ranges.

OWNER: calibration helper. CalibrationResult is shared by every stage; keep its fields.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from quantdbg.calibrators.base import TensorRange
from quantdbg.config import CalibConfig
from quantdbg.stats import TensorStats


@dataclass(frozen=True)
class CalibrationResult:
    """Activation ranges and the statistics behind them.

    Attributes:
        ranges: Activation tensor name -> chosen range.
        stats: Activation tensor name -> statistics (histograms when a histogram method ran).
        config: The configuration used.
        n_batches: Feeds consumed.
        n_samples: Samples consumed (sum of batch sizes on axis 0).
    """

    ranges: Mapping[str, TensorRange]
    stats: Mapping[str, TensorStats]
    config: CalibConfig = field(default_factory=CalibConfig)
    n_batches: int = 0
    n_samples: int = 0
