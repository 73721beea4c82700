"""Calibration: statistics of the FP32 model's activations, and the ranges calibrators choose from them.

Data flows ``stats`` (streaming collectors, exact merge) -> ``collect`` (one ONNX Runtime pass
streaming the planned activations into collectors) -> ``calibrators`` (statistics -> range,
a registry) -> ``ranges`` (:func:`calibrate`). ``smoothing`` is the SmoothQuant-style rewrite
that moves activation outliers into weights before calibration, ``equalization`` the cross-layer
equalization that balances the channels of consecutive layers, and ``bias_correction`` the mean
shift of INT8 weight rounding, measured per channel and taken out of the biases.
"""
from quantdbg.calibration.bias_correction import BiasCorrections, correct_biases
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
from quantdbg.calibration.equalization import EqualizationResult, equalize
from quantdbg.calibration.ranges import CalibrationResult, calibrate
from quantdbg.calibration.smoothing import SmoothingConfig, SmoothingResult, smooth
from quantdbg.calibration.stats import TensorStats

__all__ = [
    "BiasCorrections", "CalibrationResult", "Calibrator", "CalibratorComparison", "CollectConfig",
    "EntropyConfig", "EqualizationResult", "MinMaxConfig", "MseConfig", "PercentileConfig", "SmoothingConfig",
    "SmoothingResult", "TensorRange", "TensorStats", "available_calibrators", "calibrate", "collect_stats",
    "compare_calibrators", "correct_biases", "equalize", "register_calibrator", "smooth",
]
