"""Calibration: statistics of the FP32 model's activations, and the ranges calibrators choose from them.

Data flows ``stats`` (streaming collectors, exact merge) -> ``collect`` (one ONNX Runtime pass
streaming the planned activations into collectors) -> ``calibrators`` (statistics -> range,
a registry) -> ``ranges`` (:func:`calibrate`). ``smoothing`` is the SmoothQuant-style rewrite
that moves activation outliers into weights before calibration.
"""
from quantdbg._exports import public_names as _public_names
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
from quantdbg.calibration.collect import (
    ActivationStream,
    CollectConfig,
    Collected,
    collect_stats,
    expose_tensors,
)
from quantdbg.calibration.compare import CalibratorComparison, compare_calibrators, histogram_sqnr
from quantdbg.calibration.ranges import CalibrationResult, calibrate, recalibrate
from quantdbg.calibration.smoothing import (
    ChannelAbsmax,
    Migration,
    Placement,
    SkippedNode,
    SmoothingConfig,
    SmoothingResult,
    SmoothOp,
    apply_smoothing,
    collect_channel_absmax,
    smooth,
    smoothing_scales,
    smoothing_targets,
)
from quantdbg.calibration.stats import HIST_OVERSAMPLE, BinnedHistogram, Collector, TensorStats, merge_stats

__all__ = _public_names(globals())
