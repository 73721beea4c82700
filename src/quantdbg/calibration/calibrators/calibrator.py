"""What a calibrator is: the :class:`Calibrator` base classes and the :class:`TensorRange` they return.

A calibrator turns one tensor's :class:`~quantdbg.calibration.stats.TensorStats` into a symmetric
range. The built-in calibrators subclass these classes and name themselves (``name``,
``config_class``); the registry (:mod:`quantdbg.calibration.calibrators.base`) lists them in a
static table, so no calibrator module imports the registry and lookups never depend on what was
imported before.
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, runtime_checkable

import numpy as np

from quantdbg import _json
from quantdbg.calibration.stats import HIST_OVERSAMPLE, BinnedHistogram, TensorStats
from quantdbg.errors import ConfigError, QuantDbgWarning
from quantdbg.quant_math import scale_from_amax

_TIE = 1e-12  # relative: scores this close to the minimum count as ties (the last one wins)

ZERO_TENSOR_AMAX = 1.0
"""Range given to a tensor with no non-zero finite value: any scale represents zeros exactly, and
1.0 (scale 1/127) keeps a later non-zero value from saturating at a tiny clip."""


@dataclass(frozen=True)
class TensorRange(_json.Serializable):
    """The clipping range chosen for one tensor.

    Attributes:
        name: ONNX value name.
        lo: Lower clip (``-hi`` for symmetric quantization).
        hi: Upper clip.
        method: Name of the calibrator that chose it.
    """

    name: str
    lo: float
    hi: float
    method: str

    @property
    def amax(self) -> float:
        """The symmetric clip max(|lo|, |hi|)."""
        return float(max(abs(self.lo), abs(self.hi)))

    @property
    def scale(self) -> float:
        """Symmetric INT8 scale ``amax / 127``, rounded to float32 as stored in Q/DQ nodes."""
        return float(scale_from_amax(self.amax))


@runtime_checkable
class CalibratorProtocol(Protocol):
    """What calibrate() needs of a calibrator."""

    name: str
    needs_histogram: bool

    def compute(self, stats: TensorStats) -> TensorRange: ...


class Calibrator:
    """Base class: handles empty and all-zero tensors, then asks :meth:`compute_amax`.

    Args:
        config: An instance of the config dataclass the calibrator was registered with.
    """

    name: ClassVar[str] = "?"
    config_class: ClassVar[type] = type(None)
    needs_histogram: ClassVar[bool] = False

    def __init__(self, config: Any = None) -> None:
        self.config = config if config is not None else self.config_class()

    def compute(self, stats: TensorStats) -> TensorRange:
        """Returns the symmetric range ``[-amax, amax]`` chosen for ``stats``.

        A tensor with no non-zero finite value gets ``amax = ZERO_TENSOR_AMAX`` and a warning
        naming it (never a division by zero).

        Raises:
            ConfigError: The calibrator produced a non-finite or non-positive amax.
        """
        if stats.count == 0 or stats.absmax == 0.0:
            seen = "only zeros" if stats.count else "no finite values"
            bound = f"{ZERO_TENSOR_AMAX:g}"
            warnings.warn(f"Tensor {stats.name!r} had {seen} during calibration; it gets the range +-{bound} "
                          f"(scale {bound}/127): zeros stay exact in INT8, and the engine clips any value "
                          f"beyond +-{bound} at run time. Check that the calibration data exercises it.",
                          QuantDbgWarning, stacklevel=2)
            return TensorRange(stats.name, -ZERO_TENSOR_AMAX, ZERO_TENSOR_AMAX, self.name)
        amax = float(self.compute_amax(stats))
        if not (math.isfinite(amax) and amax > 0.0):
            raise ConfigError(f"Calibrator {self.name!r} returned amax={amax} for tensor {stats.name!r}; "
                              "expected a finite value > 0. This is a bug in the calibrator.")
        return TensorRange(stats.name, -amax, amax, self.name)

    def compute_amax(self, stats: TensorStats) -> float:
        """Returns the clip ``amax > 0`` for a tensor that has non-zero finite values."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.config!r})"


class HistogramCalibrator(Calibrator):
    """Base of the calibrators that read the |x| histogram at their own resolution.

    The config may have a ``num_bins`` field (None: the resolution the histogram was collected
    for, ``len(stats.hist) // HIST_OVERSAMPLE``).
    """

    needs_histogram: ClassVar[bool] = True

    def binned(self, stats: TensorStats) -> BinnedHistogram:
        """The tensor's histogram regrouped to this calibrator's resolution.

        Raises:
            NotCalibratedError: No histogram was collected for the tensor.
        """
        num_bins = getattr(self.config, "num_bins", None)
        if num_bins is None:
            num_bins = max(1, len(stats.hist) // HIST_OVERSAMPLE) if stats.hist is not None else 1
        return stats.binned(num_bins)


class CandidateCalibrator(HistogramCalibrator):
    """Base of the calibrators that score every candidate clip (a bin edge from ``start_bin`` on)
    and keep the last one of least score, at most max |x|."""

    def scores(self, counts: np.ndarray, start_bin: int) -> tuple[np.ndarray, np.ndarray]:
        """The candidate bins and their scores (lower is better), from the histogram's counts."""
        raise NotImplementedError

    def compute_amax(self, stats: TensorStats) -> float:
        """Returns the edge of the last candidate bin of least score (at most max |x|)."""
        hist = self.binned(stats)
        candidates, score = self.scores(hist.counts, self.config.start_bin)
        return min(best_candidate(candidates, score) * hist.width, stats.absmax)


def best_candidate(candidates: np.ndarray, score: np.ndarray) -> int:
    """The last candidate whose score is the minimum (ties within float rounding)."""
    low = float(np.min(score))
    if not np.isfinite(low):
        return int(candidates[-1])  # every candidate infinite: keep everything
    ties = np.flatnonzero(score <= low + _TIE * max(1.0, abs(low)))
    return int(candidates[ties[-1]])
