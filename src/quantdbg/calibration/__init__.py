"""Calibration: statistics of the FP32 model's activations, and the ranges calibrators choose from them.

Data flows ``stats`` (streaming collectors, exact merge) -> ``collect`` (one ONNX Runtime pass
streaming the planned activations into collectors) -> ``calibrators`` (statistics -> range,
a registry) -> ``ranges`` (:func:`calibrate`). ``smoothing`` is the SmoothQuant-style rewrite
that moves activation outliers into weights before calibration.
"""
from quantdbg.calibration.calibrators import (
    Calibrator,
    EntropyConfig,
    MinMaxConfig,
    MseConfig,
    PercentileConfig,
    TensorRange,
    available_calibrators,
    register_calibrator,
)
from quantdbg.calibration.collect import CollectConfig, collect_stats
from quantdbg.calibration.compare import CalibratorComparison, compare_calibrators
from quantdbg.calibration.ranges import CalibrationResult, calibrate
from quantdbg.calibration.smoothing import SmoothingConfig, SmoothingResult, smooth
from quantdbg.calibration.stats import Collector, TensorStats

__all__ = [
    "CalibrationResult", "Calibrator", "CalibratorComparison", "CollectConfig", "Collector", "EntropyConfig",
    "MinMaxConfig", "MseConfig", "PercentileConfig", "SmoothingConfig", "SmoothingResult", "TensorRange",
    "TensorStats", "available_calibrators", "calibrate", "collect_stats", "compare_calibrators",
    "register_calibrator", "smooth",
]
