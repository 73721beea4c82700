"""Calibrators: turn a tensor's statistics into a clipping range.

Built in: ``minmax``, ``entropy``, ``percentile``, ``mse``. Others register through
:func:`register_calibrator` or the entry-point group ``quantdbg.calibrators``.
"""
from quantdbg._exports import public_names as _public_names
from quantdbg.calibration.calibrators.base import (
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
from quantdbg.calibration.calibrators.entropy import EntropyCalibrator, EntropyConfig
from quantdbg.calibration.calibrators.minmax import MinMaxCalibrator, MinMaxConfig
from quantdbg.calibration.calibrators.mse import MseCalibrator, MseConfig
from quantdbg.calibration.calibrators.percentile import PercentileCalibrator, PercentileConfig

__all__ = _public_names(globals())
