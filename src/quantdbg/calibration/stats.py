"""Activation statistics: min, max, counts and a |x| histogram per tensor, merged exactly.

Each batch's activations are reduced to min, max, counts and a |x| histogram, then dropped; of
the samples, only the two with the largest max |x| are remembered (:class:`SamplePeak`), to name
a sample that blows a range up. The histogram's range is a power of two anchored at zero and grows
by exact bin merging (see :mod:`quantdbg.calibration._kernels`), and the two peaks are ordered by
value then sample index, so the statistics of a set of samples are bit-identical whatever the batch
size or order.
"""
from __future__ import annotations

import math
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from quantdbg import _json
from quantdbg.calibration import _kernels as _kernels
from quantdbg.errors import DataError, NotCalibratedError
from quantdbg.quant_math import FP16_MAX, fp16_split

HIST_OVERSAMPLE = 16
"""Collected bins per calibrator bin. max|x| lies anywhere in ``(R/2, R)``, so a histogram of
exactly ``num_bins`` bins could leave calibrators as few as ``num_bins/2`` useful bins; collecting
16x finer and regrouping (:meth:`TensorStats.binned`) leaves them at least ``num_bins * 8/9``."""


@dataclass(frozen=True)
class BinnedHistogram:
    """A |x| histogram at calibrator resolution: ``len(counts)`` bins of equal ``width`` from 0.

    Attributes:
        counts: int64 counts; the last bin holds max|x|.
        width: Bin width.
    """

    counts: np.ndarray
    width: float

    @property
    def edges(self) -> np.ndarray:
        """The ``len(counts) + 1`` bin edges, from 0."""
        return np.arange(self.counts.shape[0] + 1, dtype=np.float64) * self.width


@dataclass(frozen=True)
class SamplePeak(_json.Serializable):
    """The largest finite |x| one sample gave a tensor.

    Attributes:
        sample: The sample's index in the data (counted from 0 over every batch).
        absmax: Its max |x|.
    """

    sample: int
    absmax: float


PEAKS_KEPT = 2
"""Samples remembered per tensor: the largest and the runner-up, enough to tell whether one sample
alone sets a range."""


def top_peaks(peaks: Iterable[SamplePeak]) -> tuple[SamplePeak, ...]:
    """The :data:`PEAKS_KEPT` largest peaks of distinct samples (each sample's largest), largest first,
    ties to the earlier sample: a pure function of the set, so merging in any order gives the same.

    Peaks of one sample from several tensors (statistics merged for a shared scale) count once.
    """
    best: dict[int, float] = {}
    for peak in peaks:
        best[peak.sample] = max(best.get(peak.sample, -math.inf), peak.absmax)
    ranked = sorted(best.items(), key=lambda item: (-item[1], item[0]))[:PEAKS_KEPT]
    return tuple(SamplePeak(sample, absmax) for sample, absmax in ranked)


@dataclass(frozen=True, eq=False)
class TensorStats(_json.Serializable):
    """What calibration saw of one tensor, independent of how the samples were batched.

    Attributes:
        name: ONNX value name.
        min: Smallest finite value seen (0.0 when none was).
        max: Largest finite value seen (0.0 when none was).
        count: Finite values seen.
        nonfinite: NaN/Inf values seen (left out of every other field).
        hist: Counts of |x| in ``len(hist)`` equal bins over ``[0, hist_range)``, or None when
            only min/max were collected.
        hist_range: Upper edge of the histogram: a power of two (so that growing the range
            merges bins exactly and the histogram does not depend on batching).
        peaks: The samples with the largest max |x|, largest first (:func:`top_peaks`); empty when
            the tensor's values could not be told apart by sample (its axis 0 is not the samples')
            or none was finite.
        fp16_absmax: max |x| over the values float16 can hold (``|x| <= 65504``; None: none was
            seen), and
        beyond_fp16: how many finite values lie beyond that range: together, whether values beyond
            it would ruin the range (:func:`~quantdbg.quant_math.outliers_zero_the_rest`).
    """

    name: str
    min: float
    max: float
    count: int
    nonfinite: int = 0
    hist: np.ndarray | None = None
    hist_range: float | None = None
    peaks: tuple[SamplePeak, ...] = ()
    fp16_absmax: float | None = None
    beyond_fp16: int = 0

    @property
    def absmax(self) -> float:
        """max |x| over the finite values."""
        return float(max(abs(self.min), abs(self.max)))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, TensorStats):
            return NotImplemented
        same_hist = (self.hist is None and other.hist is None) or (
            self.hist is not None and other.hist is not None and np.array_equal(self.hist, other.hist))
        return same_hist and self._fields() == other._fields()

    def _fields(self) -> tuple[Any, ...]:
        return (self.name, self.min, self.max, self.count, self.nonfinite, self.hist_range, self.peaks,
                self.fp16_absmax, self.beyond_fp16)

    __hash__ = None  # type: ignore[assignment]  # holds an array: unhashable, like a dict

    def binned(self, num_bins: int) -> BinnedHistogram:
        """Regroups the collected histogram into at most ``num_bins`` bins ending at max|x|.

        Trailing empty bins are dropped and aligned groups of ``g = ceil(used / num_bins)`` bins
        are summed, so the result is a pure function of the collected histogram (hence as
        batch-invariant) and its last bin holds max|x|, as in pytorch-quantization.

        Args:
            num_bins: Maximum number of bins.

        Returns:
            The regrouped histogram.

        Raises:
            NotCalibratedError: No histogram was collected for this tensor.
        """
        if self.hist is None or self.hist_range is None:
            raise NotCalibratedError(
                f"Tensor {self.name!r} has no histogram; collect its statistics with "
                "CollectConfig(histogram=True) (calibrate() does so for every tensor whose calibrator "
                "needs one).")
        nonzero = np.flatnonzero(self.hist)
        used = int(nonzero[-1]) + 1 if nonzero.size else 1
        group = -(-used // num_bins)
        n_out = -(-used // group)
        padded = np.zeros(n_out * group, dtype=np.int64)
        padded[:used] = self.hist[:used]
        return BinnedHistogram(padded.reshape(n_out, group).sum(axis=1),
                               self.hist_range / self.hist.shape[0] * group)

    def __json_encode__(self) -> dict[str, Any]:
        """JSON form: the histogram without its trailing zeros, and its full length."""
        hist = hist_bins = None
        if self.hist is not None:
            nonzero = np.flatnonzero(self.hist)
            hist = self.hist[:int(nonzero[-1]) + 1 if nonzero.size else 0]
            hist_bins = int(self.hist.shape[0])
        return _json.encode(_StatsForm(self.name, self.min, self.max, self.count, self.nonfinite, hist,
                                       hist_bins, self.hist_range, self.peaks or None, self.fp16_absmax,
                                       self.beyond_fp16 or None))

    @classmethod
    def __json_decode__(cls, data: Any, where: str) -> TensorStats:
        """Inverse of :meth:`__json_encode__` (FormatError naming the field for bad data)."""
        form = _json.decode(_StatsForm, data, where)
        hist = None
        if form.hist is not None:
            if form.hist_bins is None or form.hist_bins < form.hist.shape[0]:
                raise _json.fail(f"{where}.hist_bins" if where else "hist_bins",
                                 f"a bin count >= {form.hist.shape[0]} (the stored bins)", form.hist_bins)
            hist = np.zeros(form.hist_bins, dtype=np.int64)
            hist[:form.hist.shape[0]] = form.hist
        values = {"name": form.name, "min": form.min, "max": form.max, "count": form.count,
                  "nonfinite": form.nonfinite, "hist": hist, "hist_range": form.hist_range,
                  "peaks": form.peaks or (), "fp16_absmax": form.fp16_absmax,
                  "beyond_fp16": form.beyond_fp16 or 0}
        return _json.construct(cls, values, where)


@dataclass(frozen=True)
class _StatsForm:
    """How :class:`TensorStats` is written: the histogram trimmed of trailing zeros, plus its length;
    empty peaks, an unknown float16 maximum and no value beyond it are left out (files written before
    them read back the same)."""

    name: str
    min: float
    max: float
    count: int
    nonfinite: int = 0
    hist: np.ndarray | None = field(default=None, metadata=_json.json_array(np.int64))
    hist_bins: int | None = None
    hist_range: float | None = None
    peaks: tuple[SamplePeak, ...] | None = field(default=None, metadata=_json.optional())
    fp16_absmax: float | None = field(default=None, metadata=_json.optional())
    beyond_fp16: int | None = field(default=None, metadata=_json.optional())


class TensorCollector:
    """Streams the batches of one tensor into min, max, counts and (optionally) a |x| histogram.

    Args:
        name: ONNX value name (for messages).
        histogram: Also build the |x| histogram.
        num_bins: Calibrator resolution; ``num_bins * HIST_OVERSAMPLE`` bins are collected.
    """

    def __init__(self, name: str, histogram: bool = False, num_bins: int = 2048) -> None:
        self.name = name
        self.histogram = histogram
        self.num_bins = num_bins
        self._hist = np.zeros(num_bins * HIST_OVERSAMPLE, dtype=np.int64) if histogram else None
        self._exponent = _kernels.EXPONENT_UNSET
        self._lo, self._hi = math.inf, -math.inf
        self._count = self._nonfinite = 0
        self._peaks: tuple[SamplePeak, ...] | None = ()  # None: the samples cannot be told apart
        self._fp16_absmax, self._beyond_fp16 = -1.0, 0  # -1: no value float16 can hold seen yet

    def update(self, array: np.ndarray, first_sample: int | None = None) -> None:
        """Adds one batch of values.

        Args:
            array: The values.
            first_sample: The index of the batch's first sample in the data when axis 0 of
                ``array`` holds samples; None when it does not, after which the tensor keeps no
                peaks (:attr:`TensorStats.peaks`).

        Raises:
            DataError: The tensor does not hold floating-point values.
        """
        array = np.asarray(array)
        if array.dtype != np.float32:
            if not np.issubdtype(array.dtype, np.floating):
                raise DataError(f"Tensor {self.name!r} holds {array.dtype} values; only floating-point "
                                "tensors can be calibrated. Remove it from the tensors to calibrate.")
            array = array.astype(np.float32)  # float16 widens exactly; float64 rounds once
        found = _kernels.scan(array, self._hist, self._exponent)
        self._exponent = found.exponent
        self._lo, self._hi = min(self._lo, found.lo), max(self._hi, found.hi)
        self._count += found.finite
        self._nonfinite += found.nonfinite
        if found.finite:
            self._count_fp16(array, max(-found.lo, found.hi))
        if first_sample is None or array.ndim == 0:
            self._peaks = None
        elif self._peaks is not None and found.finite:
            self._peaks = _with_batch_peaks(self._peaks, array, first_sample, found)

    def _count_fp16(self, array: np.ndarray, top: float) -> None:
        if top <= FP16_MAX:  # every value within float16's range: no second pass
            self._fp16_absmax = max(self._fp16_absmax, top)
            return
        ordinary, beyond = fp16_split(array)
        self._fp16_absmax = max(self._fp16_absmax, float(ordinary))
        self._beyond_fp16 += int(beyond)

    def result(self) -> TensorStats:
        """Returns the statistics so far (a snapshot; later updates do not change it)."""
        lo, hi = (self._lo + 0.0, self._hi + 0.0) if self._count else (0.0, 0.0)  # +0.0: no -0.0
        hist = None if self._hist is None else self._hist.copy()
        hist_range = None if hist is None else math.ldexp(1.0, self._exponent)
        return TensorStats(self.name, lo, hi, self._count, self._nonfinite, hist, hist_range,
                           self._peaks or (), self._fp16_absmax + 0.0 if self._fp16_absmax >= 0 else None,
                           self._beyond_fp16)


def _with_batch_peaks(peaks: tuple[SamplePeak, ...], array: np.ndarray, first: int,
                      found: _kernels.ScanResult) -> tuple[SamplePeak, ...]:
    """``peaks`` updated with a batch's samples (axis 0 of ``array``, the first one ``first``).

    A batch whose max |x| does not beat the runner-up is skipped without a second pass: its samples
    come after every sample kept, so a tie goes to the kept one. After the first batches nearly
    every batch is skipped.
    """
    top = max(-found.lo, found.hi)
    if len(peaks) == PEAKS_KEPT and top <= peaks[-1].absmax:
        return peaks
    rows = array.reshape(array.shape[0], -1)
    if found.nonfinite:
        per_sample = np.where(np.isfinite(rows), np.abs(rows), -1.0).max(axis=1)  # -1: no finite value
    else:
        per_sample = np.maximum(rows.max(axis=1), -rows.min(axis=1))
    order = np.argsort(-per_sample, kind="stable")[:PEAKS_KEPT]
    batch = [SamplePeak(first + int(i), float(per_sample[i]) + 0.0) for i in order if per_sample[i] >= 0]
    return top_peaks([*peaks, *batch])


def shift_samples(stats: TensorStats, offset: int) -> TensorStats:
    """``stats`` with its peaks' sample indices moved by ``offset`` (statistics of a later shard)."""
    return replace(stats, peaks=tuple(SamplePeak(p.sample + offset, p.absmax) for p in stats.peaks))


class Collector:
    """Streams many tensors: ``update(name, array)`` per batch, then ``result()``.

    Args:
        tensors: Tensor names to collect.
        histogram: True for every tensor, False for none, or the set of tensors needing one.
        num_bins: Calibrator resolution of the histograms.
    """

    def __init__(self, tensors: Iterable[str], histogram: bool | Collection[str] = False,
                 num_bins: int = 2048) -> None:
        wanted = set(histogram) if not isinstance(histogram, bool) else None
        self.collectors = {
            name: TensorCollector(name, bool(histogram) if wanted is None else name in wanted, num_bins)
            for name in tensors}

    def update(self, name: str, array: np.ndarray, first_sample: int | None = None) -> None:
        """Adds one batch of values of tensor ``name`` (see :meth:`TensorCollector.update`)."""
        self.collectors[name].update(array, first_sample)

    def result(self) -> dict[str, TensorStats]:
        """Returns tensor name -> statistics."""
        return {name: c.result() for name, c in self.collectors.items()}


def merge_stats(name: str, stats: Iterable[TensorStats]) -> TensorStats:
    """Statistics of the union of the values behind several :class:`TensorStats`, exactly.

    Used for tensors that must share one scale (Concat inputs) and for collections run apart.

    Args:
        name: Name of the merged statistics.
        stats: Statistics to merge; either all have histograms of one length, or none has.

    Returns:
        The same statistics a collector fed every value would have produced. Peaks are kept when
        every member with values has them; members are disjoint samples (shards, moved by
        :func:`shift_samples`) or the same samples (a shared scale), which :func:`top_peaks` merges.

    Raises:
        NotCalibratedError: Some have histograms and others not, or the lengths differ.
    """
    items = list(stats)
    hists = [s for s in items if s.hist is not None]
    if hists and (len(hists) != len(items) or len({s.hist.shape[0] for s in hists}) != 1):  # type: ignore[union-attr]
        raise NotCalibratedError(f"Cannot merge statistics into {name!r}: histograms are missing or "
                                 "of different lengths; collect them together with one num_bins.")
    seen = [s for s in items if s.count]
    lo = min((s.min for s in seen), default=0.0)
    hi = max((s.max for s in seen), default=0.0)
    count, nonfinite = sum(s.count for s in items), sum(s.nonfinite for s in items)
    peaks = () if any(not s.peaks for s in seen) else top_peaks(p for s in seen for p in s.peaks)
    ordinary = max((s.fp16_absmax for s in seen if s.fp16_absmax is not None), default=None)
    beyond = sum(s.beyond_fp16 for s in items)
    if not hists:
        return TensorStats(name, lo, hi, count, nonfinite, peaks=peaks, fp16_absmax=ordinary,
                           beyond_fp16=beyond)
    exponent = max(_kernels.range_exponent(s.hist_range) - 1 for s in hists)  # type: ignore[arg-type]
    total = np.zeros(hists[0].hist.shape[0], dtype=np.int64)  # type: ignore[union-attr]
    for s in hists:
        grown = s.hist.copy()  # type: ignore[union-attr]
        _kernels.merge_bins(grown, exponent - (_kernels.range_exponent(s.hist_range) - 1))  # type: ignore[arg-type]
        total += grown
    return TensorStats(name, lo, hi, count, nonfinite, total, math.ldexp(1.0, exponent), peaks, ordinary,
                       beyond)
