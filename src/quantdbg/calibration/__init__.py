"""Calibration: statistics of the FP32 model's activations, and the ranges calibrators choose from them.

Data flows ``stats`` (streaming collectors, exact merge) -> ``collect`` (one ONNX Runtime pass
streaming the planned activations into collectors) -> ``calibrators`` (statistics -> range,
a registry) -> ``ranges`` (:func:`calibrate`). ``smoothing`` is the SmoothQuant-style rewrite
that moves activation outliers into weights before calibration, ``equalization`` the cross-layer
equalization that balances the channels of consecutive layers, and ``bias_correction`` the mean
shift of INT8 weight rounding, measured per channel and taken out of the biases.
"""
from quantdbg._exports import public_names as _public_names
from quantdbg.calibration.bias_correction import BiasCorrection as BiasCorrection
from quantdbg.calibration.bias_correction import BiasCorrections as BiasCorrections
from quantdbg.calibration.bias_correction import SkippedLayer as SkippedLayer
from quantdbg.calibration.bias_correction import apply_bias_corrections as apply_bias_corrections
from quantdbg.calibration.bias_correction import correct_biases as correct_biases
from quantdbg.calibration.bias_correction import restore_bias as restore_bias
from quantdbg.calibration.calibrators import Calibrator as Calibrator
from quantdbg.calibration.calibrators import EntropyConfig as EntropyConfig
from quantdbg.calibration.calibrators import MinMaxConfig as MinMaxConfig
from quantdbg.calibration.calibrators import MseConfig as MseConfig
from quantdbg.calibration.calibrators import PercentileConfig as PercentileConfig
from quantdbg.calibration.calibrators import TensorRange as TensorRange
from quantdbg.calibration.calibrators import available_calibrators as available_calibrators
from quantdbg.calibration.calibrators import calibrator_name as calibrator_name
from quantdbg.calibration.calibrators import get_calibrator as get_calibrator
from quantdbg.calibration.calibrators import register_calibrator as register_calibrator
from quantdbg.calibration.calibrators.base import calibrator_amaxes as calibrator_amaxes
from quantdbg.calibration.collect import ActivationStream as ActivationStream
from quantdbg.calibration.collect import CollectConfig as CollectConfig
from quantdbg.calibration.collect import Collected as Collected
from quantdbg.calibration.collect import collect_stats as collect_stats
from quantdbg.calibration.collect import expose_tensors as expose_tensors
from quantdbg.calibration.compare import CalibratorComparison as CalibratorComparison
from quantdbg.calibration.compare import compare_calibrators as compare_calibrators
from quantdbg.calibration.compare import histogram_sqnr as histogram_sqnr
from quantdbg.calibration.equalization import Equalization as Equalization
from quantdbg.calibration.equalization import EqualizationResult as EqualizationResult
from quantdbg.calibration.equalization import EqualizedPair as EqualizedPair
from quantdbg.calibration.equalization import equalize as equalize
from quantdbg.calibration.ranges import CalibrationResult as CalibrationResult
from quantdbg.calibration.ranges import calibrate as calibrate
from quantdbg.calibration.ranges import recalibrate as recalibrate
from quantdbg.calibration.smoothing import ChannelAbsmax as ChannelAbsmax
from quantdbg.calibration.smoothing import Migration as Migration
from quantdbg.calibration.smoothing import Placement as Placement
from quantdbg.calibration.smoothing import SkippedNode as SkippedNode
from quantdbg.calibration.smoothing import SmoothingConfig as SmoothingConfig
from quantdbg.calibration.smoothing import SmoothingResult as SmoothingResult
from quantdbg.calibration.smoothing import SmoothOp as SmoothOp
from quantdbg.calibration.smoothing import apply_smoothing as apply_smoothing
from quantdbg.calibration.smoothing import collect_channel_absmax as collect_channel_absmax
from quantdbg.calibration.smoothing import smooth as smooth
from quantdbg.calibration.smoothing import smoothing_scales as smoothing_scales
from quantdbg.calibration.smoothing import smoothing_targets as smoothing_targets
from quantdbg.calibration.stats import HIST_OVERSAMPLE as HIST_OVERSAMPLE
from quantdbg.calibration.stats import BinnedHistogram as BinnedHistogram
from quantdbg.calibration.stats import Collector as Collector
from quantdbg.calibration.stats import TensorStats as TensorStats
from quantdbg.calibration.stats import merge_stats as merge_stats

__all__ = _public_names(globals())
