"""Calibrators: turn a tensor's statistics into a clipping range.

Built in: ``minmax``, ``entropy``, ``percentile``, ``mse``. Others register through
:func:`register_calibrator` or the entry-point group ``quantdbg.calibrators``.
"""
from quantdbg._exports import public_names as _public_names
from quantdbg.calibration.calibrators.base import Calibrator as Calibrator
from quantdbg.calibration.calibrators.base import CalibratorProtocol as CalibratorProtocol
from quantdbg.calibration.calibrators.base import HistogramCalibrator as HistogramCalibrator
from quantdbg.calibration.calibrators.base import TensorRange as TensorRange
from quantdbg.calibration.calibrators.base import available_calibrators as available_calibrators
from quantdbg.calibration.calibrators.base import calibrator_name as calibrator_name
from quantdbg.calibration.calibrators.base import get_calibrator as get_calibrator
from quantdbg.calibration.calibrators.base import register_calibrator as register_calibrator
from quantdbg.calibration.calibrators.entropy import EntropyCalibrator as EntropyCalibrator
from quantdbg.calibration.calibrators.entropy import EntropyConfig as EntropyConfig
from quantdbg.calibration.calibrators.minmax import MinMaxCalibrator as MinMaxCalibrator
from quantdbg.calibration.calibrators.minmax import MinMaxConfig as MinMaxConfig
from quantdbg.calibration.calibrators.mse import MseCalibrator as MseCalibrator
from quantdbg.calibration.calibrators.mse import MseConfig as MseConfig
from quantdbg.calibration.calibrators.percentile import PercentileCalibrator as PercentileCalibrator
from quantdbg.calibration.calibrators.percentile import PercentileConfig as PercentileConfig

__all__ = _public_names(globals())
