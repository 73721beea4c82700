"""Calibration: statistics of the FP32 model's activations, and the ranges calibrators choose from them.

Data flows ``stats`` (streaming collectors, exact merge) -> ``calibrators`` (statistics -> range)
-> ``ranges`` (:func:`calibrate`, one pass over the data for the planned tensors). ``smoothing``
is the SmoothQuant-style rewrite that moves activation outliers into weights before calibration.
"""
from quantdbg.calibration.calibrators import (
    Calibrator,
    EntropyConfig,
    MinMaxConfig,
    MseConfig,
    PercentileConfig,
    TensorRange,
    available_calibrators,
    calibrator_name,
    get_calibrator,
    register_calibrator,
)
from quantdbg.calibration.calibrators.base import calibrator_amaxes
from quantdbg.calibration.compare import CalibratorComparison, compare_calibrators, histogram_sqnr
from quantdbg.calibration.ranges import (
    CalibrationResult,
    calib_config_from_dict,
    calib_config_to_dict,
    calibrate,
)
from quantdbg.calibration.smoothing import (
    Migration,
    SmoothingConfig,
    SmoothingResult,
    apply_smoothing,
    collect_channel_absmax,
    smooth,
    smoothing_scales,
    smoothing_targets,
)
from quantdbg.calibration.stats import (
    Collected,
    Collector,
    TensorStats,
    collect_stats,
    expose_tensors,
    merge_stats,
)

__all__ = [
    "CalibratorComparison", "compare_calibrators", "histogram_sqnr",
    "CalibrationResult", "Calibrator", "Collected", "Collector", "EntropyConfig", "Migration", "MinMaxConfig",
    "MseConfig", "PercentileConfig", "SmoothingConfig", "SmoothingResult", "TensorRange", "TensorStats",
    "apply_smoothing", "available_calibrators", "calib_config_from_dict", "calib_config_to_dict", "calibrate",
    "calibrator_amaxes", "calibrator_name", "collect_channel_absmax", "collect_stats", "expose_tensors",
    "get_calibrator", "merge_stats", "register_calibrator", "smooth", "smoothing_scales", "smoothing_targets",
]
