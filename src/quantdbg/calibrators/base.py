"""Calibrator protocol, range types and the registry (entry-point group ``quantdbg.calibrators``).

OWNER: calibration helper. TensorRange/QParams are shared by every stage; keep their fields.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class TensorRange:
    """The clipping range chosen for one tensor.

    Attributes:
        name: ONNX value name.
        lo: Lower clip (``-hi`` for symmetric quantization).
        hi: Upper clip.
        method: Name of the calibrator that chose it.
    """

    name: str
    lo: float
    hi: float
    method: str

    @property
    def amax(self) -> float:
        """The symmetric clip max(|lo|, |hi|)."""
        return float(max(abs(self.lo), abs(self.hi)))


@dataclass(frozen=True)
class QParams:
    """Quantization parameters of one tensor.

    Attributes:
        scale: float32 scale, shape () per tensor or (C,) per channel.
        zero_point: int8 zero point (0 for symmetric), same shape as ``scale``.
        axis: Channel axis for per-channel parameters, None per tensor.
    """

    scale: np.ndarray
    zero_point: np.ndarray
    axis: int | None = None
