"""What the repairs decided, as JSON records: per-tensor calibrator choices, SmoothQuant's step, and one
:class:`RepairRecord` per repair tried."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

import numpy as np

from quantdbg import _json
from quantdbg._json import Serializable
from quantdbg.calibration import SmoothingConfig
from quantdbg.calibration.smoothing.result import Migration
from quantdbg.pipeline.config import Repair


@dataclass(frozen=True)
class TensorChoice(Serializable):
    """The calibrator chosen for one activation tensor, and what it changes.

    Attributes:
        tensor: ONNX value name.
        previous: The calibrator that chose its range before.
        calibrator: The calibrator chosen (the one whose range gives the layers reading the tensor
            the least summed local noise).
        previous_amax: The clip before.
        amax: The clip of the chosen calibrator.
        previous_sqnr: The worst local output SQNR (dB) of the layers reading it, before.
        sqnr: The same with the chosen calibrator's range.
    """

    tensor: str
    previous: str
    calibrator: str
    previous_amax: float
    amax: float
    previous_sqnr: float | None = None
    sqnr: float | None = None

    @property
    def changed(self) -> bool:
        """The chosen calibrator differs from the previous one."""
        return self.calibrator != self.previous


@dataclass(frozen=True, eq=False)
class ChannelRange(Serializable):
    """Per-channel max|x| (channels on the last axis) of one activation tensor.

    Attributes:
        tensor: ONNX value name.
        absmax: float64 max|x| per channel.
    """

    tensor: str
    absmax: np.ndarray = field(metadata=_json.json_array(np.float64))

    def __post_init__(self) -> None:
        object.__setattr__(self, "absmax", np.asarray(self.absmax, np.float64))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ChannelRange):
            return NotImplemented
        return self.tensor == other.tensor and np.array_equal(self.absmax, other.absmax)

    __hash__ = None  # type: ignore[assignment]  # holds an array

    @property
    def outlier_ratio(self) -> float:
        """Largest channel max|x| over the median channel's (inf when the median is 0)."""
        median = float(np.median(self.absmax)) if self.absmax.size else 0.0
        peak = float(self.absmax.max()) if self.absmax.size else 0.0
        return peak / median if median > 0 else (float("inf") if peak > 0 else 1.0)


@dataclass(frozen=True)
class SmoothingStep(Serializable):
    """What SmoothQuant did: enough to redo it on a re-exported model with the same node names.

    Attributes:
        config: The smoothing settings, ``nodes`` narrowed to the smoothed nodes.
        act_absmax: The measured per-channel ranges of the smoothed activations.
        migrations: One record per smoothed activation (scales, where ``1/s`` went).
        outlier_ratio: Every measured activation -> largest over median channel max|x|.
    """

    config: SmoothingConfig
    act_absmax: tuple[ChannelRange, ...]
    migrations: tuple[Migration, ...] = ()
    outlier_ratio: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "act_absmax", tuple(self.act_absmax))
        object.__setattr__(self, "outlier_ratio", MappingProxyType(dict(self.outlier_ratio)))

    def absmax(self) -> dict[str, np.ndarray]:
        """Tensor -> per-channel max|x|, as :func:`~quantdbg.calibration.smoothing.apply_smoothing` takes."""
        return {r.tensor: r.absmax for r in self.act_absmax}


@dataclass(frozen=True)
class RepairRecord(Serializable):
    """One repair the flow tried, and what it decided.

    Attributes:
        repair: Which repair.
        applied: A repaired model was built and evaluated (False: the repair does not apply here, or
            its gate found it brings the outputs no closer to FP32).
        kept: The repaired model replaced the previous one (its task metric was better).
        before: The task metric before the repair.
        after: The repaired model's task metric (None when not applied).
        reason: One sentence: why it did not apply, or what it changed and why it was kept or not.
        calibrators: Calibrator choice: every activation tensor's choice (changed or not).
        smoothing: SmoothQuant: what was smoothed.
        output_sqnr: Equalization, bias correction: the SQNR (dB) of the outputs against FP32 on the
            first samples of the evaluation data, before and with the repair (the gate that decides
            whether the repaired model is evaluated; None when no gate ran).
        at_start: The calibrator choice became the INT8 start, before the first evaluation
            (:class:`~quantdbg.pipeline.config.CalibratorRepairConfig`): ``before`` and ``after`` are
            both the start's task metric, the default calibration was not evaluated.
    """

    repair: Repair
    applied: bool
    kept: bool
    before: float
    after: float | None = None
    reason: str = ""
    calibrators: tuple[TensorChoice, ...] = ()
    smoothing: SmoothingStep | None = None
    output_sqnr: tuple[float, float] | None = field(default=None, metadata=_json.optional())
    at_start: bool = False

    @property
    def changes(self) -> tuple[TensorChoice, ...]:
        """The tensors whose calibrator changed."""
        return tuple(c for c in self.calibrators if c.changed)


__all__ = ["ChannelRange", "RepairRecord", "SmoothingStep", "TensorChoice"]
