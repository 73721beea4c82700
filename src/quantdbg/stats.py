"""Activation statistics: expose the tensors to quantize, stream batches into collectors.

OWNER: calibration helper. The TensorStats type below is shared by every stage; keep its fields.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class TensorStats:
    """What calibration saw of one tensor, independent of how the samples were batched.

    Attributes:
        name: ONNX value name.
        min: Smallest finite value seen.
        max: Largest finite value seen.
        count: Finite values seen.
        nonfinite: NaN/Inf values seen (left out of every other field).
        hist: Counts of |x| in ``len(hist)`` equal bins over ``[0, hist_range)``, or None when
            only min/max were collected.
        hist_range: Upper edge of the histogram: a power of two (so that growing the range
            merges bins exactly and the histogram does not depend on batching).
    """

    name: str
    min: float
    max: float
    count: int
    nonfinite: int = 0
    hist: np.ndarray | None = None
    hist_range: float | None = None

    @property
    def absmax(self) -> float:
        """max |x| over the finite values."""
        return float(max(abs(self.min), abs(self.max)))
