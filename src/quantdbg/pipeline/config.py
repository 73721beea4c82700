"""What the automatic flow does and how hard it tries: the repair vocabulary and :class:`AutoConfig`."""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal, get_args

from quantdbg._json import Serializable, optional
from quantdbg.backends.tensorrt import TrtConfig
from quantdbg.calibration import SmoothingConfig
from quantdbg.config import CalibConfig, QuantConfig
from quantdbg.errors import ConfigError, check_choice
from quantdbg.fallback import FallbackConfig

Repair = Literal["calibrator", "bias_correction", "equalize", "smoothquant"]
"""An INT8 repair the flow tries before any layer leaves INT8 (see :mod:`quantdbg.pipeline.repairs`)."""

REPAIRS: tuple[Repair, ...] = get_args(Repair)
"""Every repair, in the order the flow tries them by default (the CLI's ``--repairs`` choices): the
calibrator choice first (on the zoo's tighter-target runs it was the repair kept), each later one
tried only while the target is missed."""

Phase = Literal["reference", "int8", "calibrator", "bias_correction", "equalize", "smoothquant", "rank",
                "search", "verify"]
"""A phase of the flow whose task-metric evaluations are counted apart (``AutoResult.evaluations``)."""

PHASES: tuple[Phase, ...] = get_args(Phase)

Outcome = Literal["int8", "repaired", "fallback", "spread", "unreachable", "verification_failed"]
"""How the flow ended (see :class:`~quantdbg.pipeline.result.AutoResult`)."""

OUTCOMES: tuple[Outcome, ...] = get_args(Outcome)
MET_OUTCOMES: tuple[Outcome, ...] = ("int8", "repaired", "fallback")
"""The outcomes whose final model meets the target."""


def _check_min_improvement(owner: str, value: float) -> None:
    if not value >= 0.0:
        raise ConfigError(f"{owner}.min_improvement must be >= 0 (task-metric units), got {value}.")


@dataclass(frozen=True)
class _KeptIfBetter(Serializable):
    """A repair's settings when the only one is how much better the task metric must get."""

    min_improvement: float = 0.0

    def __post_init__(self) -> None:
        _check_min_improvement(type(self).__name__, self.min_improvement)


GATE_SAMPLES = 64
"""Default samples (the first batches of the evaluation data holding them) the output-SQNR gates compare
the models on."""


def _check_gate(owner: str, field_name: str, gain: float | None, samples: int) -> None:
    if gain is not None and not math.isfinite(gain):
        raise ConfigError(f"{owner}.{field_name} must be a finite number of dB or None (no gate), got "
                          f"{gain}.")
    if samples < 1:
        raise ConfigError(f"{owner}.gate_samples must be >= 1, got {samples}.")


@dataclass(frozen=True)
class _Gated(_KeptIfBetter):
    """A repair evaluated only when the outputs it gives are closer to FP32 (the cheap evidence that it
    can help the task metric, whose reference is FP32): no task-metric evaluation otherwise.

    Attributes:
        min_improvement: Kept only when the task metric improves by more than this.
        min_sqnr_gain: The repaired model is evaluated only when the SQNR (dB) of its outputs against
            FP32, on the first ``gate_samples`` samples of the evaluation data, beats the current
            model's by more than this (None: always evaluated).
        gate_samples: Samples the gate compares the outputs on (the fewest first batches holding them).

    Raises:
        ConfigError: A negative ``min_improvement``, a non-finite ``min_sqnr_gain`` or
            ``gate_samples`` below 1.
    """

    min_sqnr_gain: float | None = 0.0
    gate_samples: int = GATE_SAMPLES

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_gate(type(self).__name__, "min_sqnr_gain", self.min_sqnr_gain, self.gate_samples)


@dataclass(frozen=True)
class CalibratorRepairConfig(_KeptIfBetter):
    """The per-tensor calibrator choice (:class:`~quantdbg.pipeline.repairs.CalibratorRepair`).

    Each activation tensor gets the registered calibrator whose range gives the layers reading it
    the best local output SQNR (the sensitivity evidence, :func:`quantdbg.sensitivity.suggest_calibrators`);
    the ranges are re-derived from the calibration's statistics, with no new pass over the data.

    The choice is tried twice. Before the first INT8 evaluation, it becomes the INT8 start when its
    outputs are clearly closer to FP32 than the default calibration's (the start gate: no task-metric
    evaluation, the default calibration is then never evaluated). Otherwise it is a repair like the
    others, evaluated when the INT8 start misses the target. Within about 1 dB, the output SQNR on a
    few samples does not predict the task metric (on the zoo's text recogniser, a choice 0.6 dB
    further from FP32 scored higher), so the start gate asks for more than that; a gain of several dB
    (the MobileNet-like classifier's ReLU6 activations: 28.3 -> 31.6 dB) did predict it, a gain of
    1.6 dB on a sentence embedder's outputs did not (its retrieval MRR fell). So a start that misses
    the target gets the default calibration evaluated back, as the calibrator repair: a gate that
    mispredicts costs one evaluation, never the better calibration.

    Attributes:
        min_improvement: The choice is kept as a repair only when the task metric improves by more
            than this (in the metric's units; 0: any improvement).
        start_sqnr_gain: The choice becomes the INT8 start when the SQNR (dB) of its outputs against
            FP32, on the first ``gate_samples`` samples of the evaluation data, beats the default
            calibration's by more than this (None: the default calibration is always the start).
        gate_samples: Samples the start gate compares the outputs on.

    Raises:
        ConfigError: A negative ``min_improvement``, a non-finite ``start_sqnr_gain`` or
            ``gate_samples`` below 1.
    """

    start_sqnr_gain: float | None = 1.0
    gate_samples: int = GATE_SAMPLES

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_gate("CalibratorRepairConfig", "start_sqnr_gain", self.start_sqnr_gain, self.gate_samples)


@dataclass(frozen=True)
class EqualizeRepairConfig(_Gated):
    """Cross-layer equalization (:class:`~quantdbg.pipeline.repairs.EqualizeRepair`): the channels of
    consecutive Conv/Gemm layers rescaled so their ranges balance (:func:`quantdbg.calibration.equalize`),
    then one calibration pass of the equalized model.

    Gated as :class:`_Gated` says: balancing weight ranges can widen the per-tensor activation ranges
    between the layers, so it can lower the INT8 model's accuracy; the gate's short pass says so
    without spending an evaluation.
    """


@dataclass(frozen=True)
class BiasCorrectionRepairConfig(_Gated):
    """Bias correction (:class:`~quantdbg.pipeline.repairs.BiasCorrectionRepair`): the mean shift INT8
    weight rounding adds to each output channel, measured in one pass and taken out of the biases
    (:mod:`quantdbg.calibration.bias_correction`).

    Gated as :class:`_Gated` says: a shift small beside the rest of the INT8 error changes nothing a
    task metric sees, and the gate's short pass says so without spending an evaluation.
    """


@dataclass(frozen=True)
class SmoothQuantRepairConfig(Serializable):
    """SmoothQuant on the MatMul/Gemm nodes whose activations carry outlier channels
    (:class:`~quantdbg.pipeline.repairs.SmoothQuantRepair`).

    Attributes:
        smoothing: Strength, op types and node selection (its ``nodes`` are narrowed to the nodes
            reading an activation with outlier channels).
        min_outlier_ratio: An activation carries outlier channels when its largest per-channel
            max|x| is at least this many times its median channel's.
        min_improvement: SmoothQuant is kept only when the task metric improves by more than this.

    Raises:
        ConfigError: ``min_outlier_ratio`` below 1 or a negative ``min_improvement``.
    """

    smoothing: SmoothingConfig = field(default_factory=SmoothingConfig)
    min_outlier_ratio: float = 10.0
    min_improvement: float = 0.0

    def __post_init__(self) -> None:
        if not self.min_outlier_ratio >= 1.0:
            raise ConfigError(f"SmoothQuantRepairConfig.min_outlier_ratio must be >= 1, got "
                              f"{self.min_outlier_ratio}.")
        _check_min_improvement("SmoothQuantRepairConfig", self.min_improvement)


@dataclass(frozen=True)
class AutoConfig(Serializable):
    """How :func:`quantdbg.auto` calibrates, repairs, ranks and searches.

    Attributes:
        calib: The default calibration (the repairs start from it).
        quant: Where Q/DQ pairs go.
        repairs: The INT8 repairs to try, in order; each is kept only when the task metric improves.
        calibrator: Settings of the per-tensor calibrator choice.
        smoothquant: Settings of SmoothQuant.
        fallback: Ranking, search strategy, budget and the precision of the layers kept out of INT8.
        max_fallback_share: The largest share of the quantized layers the flow keeps out of INT8
            (at least one layer). When the search needs more, the error is spread over the model:
            the flow says so and stops at the best set within this share.
        batch_size: Samples per feed for arrays and ``.npz`` files (None: 32).
        threads: ONNX Runtime intra-op threads (0: all cores).
        progress: Show progress bars (else log lines at DEBUG).
        resume_path: The run's journal (:mod:`quantdbg._journal`), every finished pass and
            evaluation appended as it is made; a run stopped earlier resumes from it (it must
            belong to the same model, data, metric, evaluation files, target and settings).
            None: nothing is written.
        engine: The TensorRT profile and build settings of the result's build commands (None: a
            dynamic batch from 1 to ``batch_size``, the rule of every command).
        equalize: Settings of cross-layer equalization.
        bias_correction: Settings of bias correction.

    Raises:
        ConfigError: An unknown or repeated repair, a share outside (0, 1], a batch size below 1
            or negative threads.
    """

    calib: CalibConfig = field(default_factory=CalibConfig)
    quant: QuantConfig = field(default_factory=QuantConfig)
    repairs: tuple[Repair, ...] = REPAIRS
    calibrator: CalibratorRepairConfig = field(default_factory=CalibratorRepairConfig)
    smoothquant: SmoothQuantRepairConfig = field(default_factory=SmoothQuantRepairConfig)
    fallback: FallbackConfig = field(default_factory=FallbackConfig)
    max_fallback_share: float = 0.25
    batch_size: int | None = None
    threads: int = 0
    progress: bool = False
    resume_path: Path | None = None
    engine: TrtConfig | None = field(default=None, metadata=optional())
    equalize: EqualizeRepairConfig = field(default_factory=EqualizeRepairConfig)
    bias_correction: BiasCorrectionRepairConfig = field(default_factory=BiasCorrectionRepairConfig)

    def __post_init__(self) -> None:
        if isinstance(self.repairs, str):
            raise ConfigError(f"repairs takes a sequence of repair names, not one string; write "
                              f"({self.repairs!r},).")
        object.__setattr__(self, "repairs", tuple(self.repairs))
        for name in self.repairs:
            check_choice("repair", name, REPAIRS)
        if len(set(self.repairs)) != len(self.repairs):
            raise ConfigError(f"repairs lists a repair twice: {self.repairs}; give each once, in the order "
                              "to try them.")
        if not 0.0 < self.max_fallback_share <= 1.0:
            raise ConfigError(f"max_fallback_share must be in (0, 1], got {self.max_fallback_share}.")
        if self.batch_size is not None and self.batch_size < 1:
            raise ConfigError(f"batch_size must be >= 1 or None, got {self.batch_size}.")
        if self.threads < 0:
            raise ConfigError(f"threads must be >= 0 (0: all cores), got {self.threads}.")
        if self.resume_path is not None:
            object.__setattr__(self, "resume_path", Path(self.resume_path))

    def fallback_limit(self, n_layers: int) -> int:
        """The most layers (of ``n_layers`` quantized ones) the flow keeps out of INT8 (at least 1)."""
        return max(1, int(self.max_fallback_share * n_layers + 1e-9))

    def settings(self) -> AutoConfig:
        """The settings that decide the result: progress, the journal and the build commands'
        settings left out (for its ingredients)."""
        sensitivity = replace(self.fallback.sensitivity, progress=False, results_path=None)
        return replace(self, fallback=replace(self.fallback, sensitivity=sensitivity), progress=False,
                       resume_path=None, engine=None)


__all__ = ["GATE_SAMPLES", "MET_OUTCOMES", "OUTCOMES", "PHASES", "REPAIRS", "AutoConfig",
           "BiasCorrectionRepairConfig", "CalibratorRepairConfig", "EqualizeRepairConfig", "Outcome", "Phase",
           "Repair", "SmoothQuantRepairConfig"]
