"""Calibration: statistics of the FP32 model's activations, and the ranges calibrators choose from them.

Data flows ``stats`` (streaming collectors, exact merge) -> ``calibrators`` (statistics -> range)
-> ``ranges`` (:func:`calibrate`, one pass over the data for the planned tensors). ``smoothing``
is the SmoothQuant-style rewrite that moves activation outliers into weights before calibration.
"""
from quantdbg.calibration.calibrators.base import (
           TensorRange,
           available_calibrators,
           get_calibrator,
           register_calibrator,
)
from quantdbg.calibration.ranges import CalibrationResult, calibrate
from quantdbg.calibration.stats import TensorStats, collect_stats

__all__ = ["CalibrationResult", "TensorRange", "TensorStats", "available_calibrators", "calibrate",
           "collect_stats", "get_calibrator", "register_calibrator"]
