"""Activation statistics: expose the tensors to quantize, stream batches into collectors.

Nothing per sample is kept: each batch's activations are reduced to min, max, counts and a |x|
histogram, then dropped. The histogram's range is a power of two anchored at zero and grows by
exact bin merging (see :mod:`quantdbg._kernels`), so the statistics of a set of samples are
bit-identical whatever the batch size or order.
"""
from __future__ import annotations

import logging
import math
import warnings
from collections.abc import Collection, Iterable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from itertools import islice
from typing import Any

import numpy as np
import onnx

from quantdbg._progress import track
from quantdbg.calibration import _kernels as _kernels
from quantdbg.data import DataSource, FeedList, as_data, check_feed, samples_in
from quantdbg.errors import BackendError, DataError, ModelError, NotCalibratedError, QuantDbgWarning, unknown
from quantdbg.model import ModelSource, as_loaded, input_specs

logger = logging.getLogger(__name__)

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


@dataclass(frozen=True, eq=False)
class TensorStats:
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
    """

    name: str
    min: float
    max: float
    count: int
    nonfinite: int = 0
    hist: np.ndarray | None = None
    hist_range: float | None = None

    @property
    def absmax(self) -> float:
        """max |x| over the finite values."""
        return float(max(abs(self.min), abs(self.max)))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, TensorStats):
            return NotImplemented
        same_hist = (self.hist is None and other.hist is None) or (
            self.hist is not None and other.hist is not None and np.array_equal(self.hist, other.hist))
        return same_hist and (self.name, self.min, self.max, self.count, self.nonfinite, self.hist_range) == (
            other.name, other.min, other.max, other.count, other.nonfinite, other.hist_range)

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
                f"Tensor {self.name!r} has no histogram; collect its statistics with histogram=True "
                "(calibrate() does so for every tensor whose calibrator needs one).")
        nonzero = np.flatnonzero(self.hist)
        used = int(nonzero[-1]) + 1 if nonzero.size else 1
        group = -(-used // num_bins)
        n_out = -(-used // group)
        padded = np.zeros(n_out * group, dtype=np.int64)
        padded[:used] = self.hist[:used]
        return BinnedHistogram(padded.reshape(n_out, group).sum(axis=1),
                               self.hist_range / self.hist.shape[0] * group)

    def to_dict(self) -> dict[str, Any]:
        """Returns a JSON-serialisable dict (histogram without its trailing zeros)."""
        out: dict[str, Any] = {"name": self.name, "min": self.min, "max": self.max, "count": self.count,
                               "nonfinite": self.nonfinite, "hist": None, "hist_bins": None,
                               "hist_range": self.hist_range}
        if self.hist is not None:
            nonzero = np.flatnonzero(self.hist)
            used = int(nonzero[-1]) + 1 if nonzero.size else 0
            out["hist"] = [int(c) for c in self.hist[:used]]
            out["hist_bins"] = int(self.hist.shape[0])
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TensorStats:
        """Inverse of :meth:`to_dict`."""
        hist = None
        if data.get("hist") is not None:
            hist = np.zeros(int(data["hist_bins"]), dtype=np.int64)
            hist[:len(data["hist"])] = data["hist"]
        hist_range = data.get("hist_range")
        return cls(str(data["name"]), float(data["min"]), float(data["max"]), int(data["count"]),
                   int(data.get("nonfinite", 0)), hist, None if hist_range is None else float(hist_range))


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

    def update(self, array: np.ndarray) -> None:
        """Adds one batch of values.

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

    def result(self) -> TensorStats:
        """Returns the statistics so far (a snapshot; later updates do not change it)."""
        lo, hi = (self._lo + 0.0, self._hi + 0.0) if self._count else (0.0, 0.0)  # +0.0: no -0.0
        hist = None if self._hist is None else self._hist.copy()
        hist_range = None if hist is None else math.ldexp(1.0, self._exponent)
        return TensorStats(self.name, lo, hi, self._count, self._nonfinite, hist, hist_range)


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

    def update(self, name: str, array: np.ndarray) -> None:
        """Adds one batch of values of tensor ``name``."""
        self.collectors[name].update(array)

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
        The same statistics a collector fed every value would have produced.

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
    if not hists:
        return TensorStats(name, lo, hi, count, nonfinite)
    exponent = max(_kernels.range_exponent(s.hist_range) - 1 for s in hists)  # type: ignore[arg-type]
    total = np.zeros(hists[0].hist.shape[0], dtype=np.int64)  # type: ignore[union-attr]
    for s in hists:
        grown = s.hist.copy()  # type: ignore[union-attr]
        _kernels.merge_bins(grown, exponent - (_kernels.range_exponent(s.hist_range) - 1))  # type: ignore[arg-type]
        total += grown
    return TensorStats(name, lo, hi, count, nonfinite, total, math.ldexp(1.0, exponent))


class Collected(Mapping[str, TensorStats]):
    """What one pass over the data saw: tensor name -> statistics, with the batches and samples consumed.

    Args:
        stats: Tensor name -> statistics, in the order asked for.
        n_batches: Feeds consumed.
        n_samples: Samples consumed (axis 0 of the first input, summed).
    """

    def __init__(self, stats: Mapping[str, TensorStats], n_batches: int, n_samples: int) -> None:
        self._stats = dict(stats)
        self.n_batches = n_batches
        self.n_samples = n_samples

    def __getitem__(self, name: str) -> TensorStats:
        return self._stats[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._stats)

    def __len__(self) -> int:
        return len(self._stats)


def collect_stats(model: ModelSource, data: DataSource, tensors: Iterable[str], *,
                  histogram: bool | Collection[str] = False, num_bins: int = 2048,
                  max_batches: int | None = None, progress: bool = False,
                  session_options: Any = None) -> Collected:
    """Runs ``data`` through ``model`` and streams ``tensors`` into collectors.

    Args:
        model: Path, ModelProto (never modified; a copy exposes the tensors as outputs) or
            LoadedModel (not re-checked).
        data: Calibration data (see :func:`quantdbg.data.as_data`); iterated once, at most
            ``max_batches`` feeds pulled.
        tensors: Value names to collect; graph inputs are allowed.
        histogram: Build |x| histograms for every tensor (True), none, or the tensors named.
        num_bins: Calibrator resolution of the histograms.
        max_batches: Stop after this many feeds (None: all).
        progress: Show a progress bar (tqdm when installed, else log lines).
        session_options: ``onnxruntime.SessionOptions`` (None: ONNX Runtime's defaults).

    Returns:
        Tensor name -> statistics, in the order of ``tensors``, with the batches and samples consumed.

    Raises:
        ModelError: The model is invalid or a tensor name is unknown or names a weight.
        DataError: A feed does not match the model (the message names the batch), a tensor is
            not floating point, or there is no data.
        BackendError: ONNX Runtime failed on a batch.
    """
    model = as_loaded(model).proto
    names = list(dict.fromkeys(tensors))
    specs = input_specs(model)
    check_activations(model, names, " (a weight): weight ranges come from the initializer itself, "
                      "not from calibration. Calibrate activations only.")
    session = open_session(expose_tensors(model, names), _deterministic(session_options), "calibration")
    fetch = [n for n in names if n not in specs]
    collector = Collector(names, histogram, num_bins)
    feeds = as_data(data, inputs=list(specs))
    n_batches = n_samples = 0
    # One worker scans batch b while ONNX Runtime computes batch b+1 (the numba kernel releases
    # the GIL); waiting for it before queueing the next bounds memory to two batches of outputs.
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="quantdbg-stats") as worker:
        pending: Future[None] | None = None
        batches = track(islice(feeds, max_batches), total=_num_batches(feeds, max_batches),
                        desc="calibration", enabled=progress)
        for index, feed in enumerate(batches):
            checked = check_feed(feed, specs, where=f"calibration batch {index}")
            fetched = dict(zip(fetch, run_batch(session, fetch, checked, index), strict=True))
            arrays = {n: checked[n] if n in specs else fetched[n] for n in names}
            if pending is not None:
                pending.result()
            pending = worker.submit(_update_all, collector, arrays)
            n_batches += 1
            n_samples += samples_in(checked)
        if pending is not None:
            pending.result()
    if n_batches == 0:
        raise DataError("The calibration data yielded no batches; give at least one feed.")
    return Collected(collector.result(), n_batches, n_samples)


def _update_all(collector: Collector, arrays: Mapping[str, np.ndarray]) -> None:
    for name, array in arrays.items():
        collector.update(name, array)


def check_activations(model: onnx.ModelProto, names: Iterable[str], weight_hint: str) -> None:
    """Checks that every name is an activation: a graph input or a node output, not an initializer.

    Args:
        model: The loaded model.
        names: Value names.
        weight_hint: Ends the message for an initializer, after ``Tensor 'w' is an initializer``.

    Raises:
        ModelError: A name is an initializer, or no value of the model (with close matches).
    """
    weights = {init.name for init in model.graph.initializer}
    known = {vi.name for vi in model.graph.input} | {o for node in model.graph.node for o in node.output}
    for name in names:
        if name in weights:
            raise ModelError(f"Tensor {name!r} is an initializer{weight_hint}")
        if name not in known:
            raise unknown("tensor", name, sorted(known - weights))


def expose_tensors(model: onnx.ModelProto, names: Iterable[str]) -> onnx.ModelProto:
    """Returns a copy of ``model`` whose graph outputs also include ``names`` (graph inputs skipped).

    Args:
        model: A loaded model (not modified).
        names: Value names produced by nodes.

    Returns:
        The copy.
    """
    exposed = onnx.ModelProto()
    exposed.CopyFrom(model)
    graph = exposed.graph
    present = {vi.name for vi in graph.output} | {vi.name for vi in graph.input}
    typed = {vi.name: vi for vi in graph.value_info}
    for name in names:
        if name in present:
            continue
        info = onnx.ValueInfoProto()
        if name in typed:
            info.CopyFrom(typed[name])
        else:  # shape inference could not type it; ONNX Runtime accepts an untyped output
            info.name = name
        graph.output.append(info)
        present.add(name)
    return exposed


def _deterministic(options: Any) -> Any:
    """``options``, or (None) ONNX Runtime defaults with deterministic kernels."""
    if options is not None:
        return options
    import onnxruntime as ort  # core dependency, imported here to keep `import quantdbg.stats` cheap

    # Scales must not change from run to run: ask ORT for its deterministic kernels.
    options = ort.SessionOptions()
    options.use_deterministic_compute = True
    return options


def open_session(model: onnx.ModelProto, options: Any, purpose: str) -> Any:
    """An ONNX Runtime CPU session for a model whose tensors were exposed as outputs.

    Args:
        model: The model, e.g. from :func:`expose_tensors`.
        options: ``onnxruntime.SessionOptions`` (None: ONNX Runtime's defaults).
        purpose: What the exposed outputs are for, named in the error (``"calibration"``).

    Returns:
        The ``onnxruntime.InferenceSession``.

    Raises:
        BackendError: ONNX Runtime could not load the model.
    """
    import onnxruntime as ort  # core dependency, imported here to keep `import quantdbg.stats` cheap

    try:
        return ort.InferenceSession(model.SerializeToString(), sess_options=options,
                                    providers=["CPUExecutionProvider"])
    except Exception as err:  # ORT raises its own exception types
        raise BackendError(f"ONNX Runtime could not load the model with {purpose} outputs: {err}") from err


def run_batch(session: Any, fetch: list[str], feed: dict[str, np.ndarray], index: int) -> list[np.ndarray]:
    """Fetches ``fetch`` for calibration batch ``index`` (no run when nothing is fetched).

    Args:
        session: A session from :func:`open_session`; may be None when ``fetch`` is empty.
        fetch: Output names to return.
        feed: A checked feed.
        index: The batch's position, named in the error.

    Returns:
        One array per name in ``fetch``.

    Raises:
        BackendError: ONNX Runtime failed on the batch.
    """
    if not fetch:
        return []
    try:
        return session.run(fetch, feed)
    except Exception as err:  # ORT raises its own exception types
        raise BackendError(f"ONNX Runtime failed on calibration batch {index}: {err}") from err


def _num_batches(data: Any, max_batches: int | None) -> int | None:
    # ArrayData knows its batch count; len() of ArrayData counts samples, so only trust len()
    # of plain feed lists.
    total = getattr(data, "num_batches", None)
    if total is None and isinstance(data, (FeedList, list, tuple)):
        total = len(data)
    if total is not None and max_batches is not None:
        total = min(total, max_batches)
    return total


def warn_nonfinite(stats: Mapping[str, TensorStats]) -> None:
    """Warns (QuantDbgWarning) once per tensor that had NaN/Inf values, with their count."""
    for name, s in stats.items():
        if s.nonfinite:
            warnings.warn(f"Tensor {name!r}: {s.nonfinite} NaN/Inf value(s) out of {s.count + s.nonfinite} "
                          "were left out of its statistics. Check the model and the calibration data.",
                          QuantDbgWarning, stacklevel=3)
