"""Calibrators: turn a tensor's statistics into a clipping range.

Built in: ``minmax``, ``entropy``, ``percentile``, ``mse``. Others register through
:func:`register_calibrator` or the entry-point group ``quantdbg.calibrators``.
"""
from quantdbg.calibrators.base import (
    Calibrator,
    CalibratorProtocol,
    HistogramCalibrator,
    QParams,
    TensorRange,
    available_calibrators,
    calibrator_name,
    get_calibrator,
    register_calibrator,
)
from quantdbg.calibrators.entropy import EntropyCalibrator, EntropyConfig
from quantdbg.calibrators.minmax import MinMaxCalibrator, MinMaxConfig
from quantdbg.calibrators.mse import MseCalibrator, MseConfig
from quantdbg.calibrators.percentile import PercentileCalibrator, PercentileConfig

__all__ = [
    "Calibrator", "CalibratorProtocol", "EntropyCalibrator", "EntropyConfig", "HistogramCalibrator",
    "MinMaxCalibrator", "MinMaxConfig", "MseCalibrator", "MseConfig", "PercentileCalibrator",
    "PercentileConfig", "QParams", "TensorRange", "available_calibrators", "calibrator_name",
    "get_calibrator", "register_calibrator",
]
