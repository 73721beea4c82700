"""Calibrators: turn a tensor's statistics into a clipping range.

Built in: ``minmax``, ``entropy``, ``percentile``, ``mse``. Others register through
:func:`register_calibrator` or the entry-point group ``quantdbg.calibrators``.
"""
from quantdbg.calibration.calibrators.base import (
    Calibrator,
    HistogramCalibrator,
    TensorRange,
    available_calibrators,
    get_calibrator,
    register_calibrator,
)
from quantdbg.calibration.calibrators.entropy import EntropyCalibrator, EntropyConfig
from quantdbg.calibration.calibrators.minmax import MinMaxCalibrator, MinMaxConfig
from quantdbg.calibration.calibrators.mse import MseCalibrator, MseConfig
from quantdbg.calibration.calibrators.percentile import PercentileCalibrator, PercentileConfig

__all__ = [
    "Calibrator", "EntropyCalibrator", "EntropyConfig", "HistogramCalibrator", "MinMaxCalibrator",
    "MinMaxConfig", "MseCalibrator", "MseConfig", "PercentileCalibrator", "PercentileConfig", "TensorRange",
    "available_calibrators", "get_calibrator", "register_calibrator",
]
