"""Activations through ONNX Runtime: expose the tensors to measure, stream batches into collectors.

One streaming pass per call: each batch's activations are handed on (to the statistics
collectors here, to the per-channel ranges of smoothing) and dropped, so memory does not grow
with the number of samples.
"""
from __future__ import annotations

import logging
import warnings
from collections.abc import Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from itertools import islice
from typing import Any

import numpy as np
import onnx

from quantdbg._progress import track
from quantdbg.calibration.stats import Collector, TensorStats, merge_stats, shift_samples
from quantdbg.config import check_shards
from quantdbg.data import (
    DataSource,
    FeedList,
    SampleFeed,
    ShardableData,
    as_model_data,
    check_feed,
    samples_in,
    shard_bounds,
)
from quantdbg.errors import BackendError, ConfigError, DataError, ModelError, QuantDbgWarning, unknown
from quantdbg.execution import Executor
from quantdbg.model.load import ModelSource, as_loaded
from quantdbg.model.specs import input_specs
from quantdbg.model.staging import staged

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class CollectConfig:
    """What :func:`collect_stats` collects.

    Attributes:
        histogram: Build |x| histograms for every tensor (True), for none (False), or for the
            tensors named (any collection of names; stored as a frozenset).
        num_bins: Calibrator resolution of the histograms (``num_bins * HIST_OVERSAMPLE`` bins
            are collected).
        max_batches: Stop after this many feeds (None: all).
        executor: Collect on it (None: in this process, one pass): the feeds are cut into
            ``shards`` consecutive runs, each collected as a task, and the statistics merged
            exactly (:func:`~quantdbg.calibration.stats.merge_stats`), so they are the same bits.
        shards: Runs of feeds with an executor (None: its ``workers()``; at most one per feed).
    """

    histogram: bool | frozenset[str] = False
    num_bins: int = 2048
    max_batches: int | None = None
    executor: Executor | None = field(default=None, compare=False)
    shards: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.histogram, str):
            raise ConfigError(f"CollectConfig.histogram takes True, False or a collection of tensor names, "
                              f"not one string ({self.histogram!r}); write {{{self.histogram!r}}}.")
        if not isinstance(self.histogram, bool):
            object.__setattr__(self, "histogram", frozenset(self.histogram))
        if isinstance(self.num_bins, bool) or not isinstance(self.num_bins, int) or self.num_bins < 1:
            raise ConfigError(f"CollectConfig.num_bins must be an integer >= 1, got {self.num_bins!r}.")
        if self.max_batches is not None and self.max_batches < 1:
            raise ConfigError(f"CollectConfig.max_batches must be >= 1 or None, got {self.max_batches}.")
        check_shards(self.shards)


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


@dataclass(frozen=True)
class BatchSamples:
    """Which samples of the data one batch holds.

    Attributes:
        first: The index of its first sample (counted from 0 over every batch).
        count: How many samples it holds.
        single: The feed is one sample whatever its shape (inputs without a batch axis, or a fixed
            batch of 1): every tensor's values belong to that sample.
    """

    first: int
    count: int
    single: bool = False

    def split(self, array: np.ndarray, batched: bool) -> tuple[np.ndarray, int | None]:
        """``array`` with its samples on axis 0, and the index of the first (None: its values cannot
        be told apart by sample).

        Args:
            array: One tensor's values in this batch.
            batched: The tensor's axis 0 is the inputs' batch axis (:func:`sample_axis_tensors`).
        """
        if self.single:
            return np.asarray(array)[np.newaxis], self.first
        if batched and np.ndim(array) and np.shape(array)[0] == self.count:
            return array, self.first
        return array, None


class ActivationStream:
    """Batches of a model's activations: one ONNX Runtime session fetching the named tensors.

    Iterating :meth:`batches` runs the model on one feed at a time and yields the values of
    ``names`` (graph inputs straight from the checked feed); the consumer reduces and drops them.
    While it holds a batch, :attr:`samples` says which samples of the data that batch holds.

    Args:
        model: The loaded model (not modified; a copy exposes the tensors as outputs).
        names: Activation value names, checked by :func:`check_activations`.
        purpose: What the pass is for (``"calibration"``, ``"smoothing"``): labels the progress
            bar and load errors.
        session_options: ``onnxruntime.SessionOptions`` (None: ONNX Runtime's defaults).
    """

    def __init__(self, model: onnx.ModelProto, names: Sequence[str], purpose: str,
                 session_options: Any = None) -> None:
        self.model = model
        self.names = list(names)
        self.purpose = purpose
        self.session_options = session_options
        self.n_batches = 0
        self.n_samples = 0
        self.samples = BatchSamples(0, 0)

    def batches(self, data: DataSource, max_batches: int | None = None,
                progress: bool = False) -> Iterator[dict[str, np.ndarray]]:
        """Yields tensor name -> values for each feed, in order, each feed pulled once.

        Args:
            data: Feeds (see :func:`quantdbg.data.as_data`); iterated once.
            max_batches: Stop after this many feeds (None: all).
            progress: Show a progress bar.

        Yields:
            One dict per feed, keyed by ``names`` in their order.

        Raises:
            DataError: A feed does not match the model (the message names the batch), or the
                data yielded no feed.
            BackendError: ONNX Runtime could not load the model or failed on a batch.
        """
        specs = input_specs(self.model)
        fetch = [n for n in self.names if n not in specs]
        session = open_session(expose_tensors(self.model, fetch), self.session_options,
                               self.purpose) if fetch else None
        feeds = as_model_data(data, self.model)
        batches = track(islice(feeds, max_batches), total=_num_batches(feeds, max_batches),
                        desc=self.purpose, enabled=progress)
        one_per_feed = bool(specs) and all(spec.fixed_batch == 1 for spec in specs.values())
        for index, feed in enumerate(batches):
            checked = check_feed(feed, specs, where=f"calibration batch {index}", first_sample=self.n_samples)
            fetched = dict(zip(fetch, run_batch(session, fetch, checked, index), strict=True))
            self.samples = BatchSamples(self.n_samples, samples_in(checked),
                                        one_per_feed or isinstance(checked, SampleFeed))
            self.n_batches += 1
            self.n_samples += self.samples.count
            yield {n: checked[n] if n in specs else fetched[n] for n in self.names}
        if self.n_batches == 0:
            raise DataError("The calibration data yielded no batches; give at least one feed.")


_DEFAULT_COLLECT = CollectConfig()


def collect_stats(model: ModelSource, data: DataSource, tensors: Iterable[str],
                  config: CollectConfig = _DEFAULT_COLLECT, *, progress: bool = False,
                  session_options: Any = None) -> Collected:
    """Runs ``data`` through ``model`` and streams ``tensors`` into collectors.

    Args:
        model: Path, ModelProto (never modified; a copy exposes the tensors as outputs) or
            LoadedModel (not re-checked).
        data: Calibration data (see :func:`quantdbg.data.as_data`); iterated once, at most
            ``config.max_batches`` feeds pulled.
        tensors: Value names to collect; graph inputs are allowed.
        config: Which tensors get histograms, at which resolution, and the batch limit.
        progress: Show a progress bar (tqdm when installed, else log lines).
        session_options: ``onnxruntime.SessionOptions`` (None: ONNX Runtime's defaults with
            deterministic kernels).

    Returns:
        Tensor name -> statistics, in the order of ``tensors``, with the batches and samples consumed.

    Raises:
        ModelError: The model is invalid or a tensor name is unknown or names a weight.
        DataError: A feed does not match the model (the message names the batch), a tensor is
            not floating point, or there is no data.
        BackendError: ONNX Runtime failed on a batch.
    """
    proto = as_loaded(model).proto
    names = list(dict.fromkeys(tensors))
    check_activations(proto, names, " (a weight): weight ranges come from the initializer itself, "
                      "not from calibration. Calibrate activations only.")
    if config.executor is not None:
        if session_options is not None:
            raise ConfigError("session_options cannot travel to an executor's workers; drop them or "
                              "collect without an executor.")
        return _collect_sharded(proto, names, data, config, progress)
    stream = ActivationStream(proto, names, "calibration", _deterministic(session_options))
    collector = Collector(names, config.histogram, config.num_bins)
    batched = sample_axis_tensors(proto, names)
    # One worker scans batch b while ONNX Runtime computes batch b+1 (the numba kernel releases
    # the GIL); waiting for it before queueing the next bounds memory to two batches of outputs.
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="quantdbg-stats") as worker:
        pending: Future[None] | None = None
        for arrays in stream.batches(data, config.max_batches, progress):
            if pending is not None:
                pending.result()
            pending = worker.submit(_update_all, collector, arrays, stream.samples, batched)
        if pending is not None:
            pending.result()
    return Collected(collector.result(), stream.n_batches, stream.n_samples)


@dataclass(frozen=True)
class _ShardJob:
    """What every shard task reads (sent to each worker once): the model, the names, the data."""

    model: onnx.ModelProto
    names: tuple[str, ...]
    config: CollectConfig
    data: ShardableData = field(repr=False)


def _collect_sharded(proto: onnx.ModelProto, names: list[str], data: DataSource, config: CollectConfig,
                     progress: bool) -> Collected:
    """:func:`collect_stats` over shards of the feeds, as tasks of ``config.executor``, merged exactly."""
    executor = config.executor
    assert executor is not None
    feeds = as_model_data(data, proto)
    if not isinstance(feeds, ShardableData):
        raise ConfigError(f"Data of type {type(feeds).__name__} cannot be cut into shards; pass an .npz "
                          "path, arrays or a list of feeds, or give the data num_batches and "
                          "shard(index, count) (quantdbg.data.ShardableData).")
    if config.max_batches is not None:
        head = getattr(feeds, "head", None)
        if head is None:
            raise ConfigError(f"max_batches cannot be applied to sharded {type(feeds).__name__} data; "
                              "cut the data to the batches wanted instead.")
        feeds = head(config.max_batches)
    count = max(1, min(config.shards or executor.workers(), feeds.num_batches))
    job = _ShardJob(proto, tuple(names), CollectConfig(config.histogram, config.num_bins), feeds)
    parts: list[Collected] = executor.map(_collect_shard, [(i, count) for i in range(count)], shared=job,
                                          desc="calibration shards", progress=progress)
    firsts = [sum(p.n_samples for p in parts[:i]) for i in range(len(parts))]  # each counted from 0
    merged = {name: merge_stats(name, (shift_samples(part[name], first) for part, first in zip(
        parts, firsts, strict=True))) for name in names}
    return Collected(merged, sum(p.n_batches for p in parts), sum(p.n_samples for p in parts))


def _collect_shard(job: _ShardJob, shard: tuple[int, int]) -> Collected:
    try:
        return collect_stats(job.model, job.data.shard(*shard), job.names, job.config)
    except (DataError, BackendError) as err:  # batch numbers in the message count from the shard's start
        start, stop = shard_bounds(job.data.num_batches, *shard)
        raise type(err)(f"Calibration shard {shard[0] + 1} of {shard[1]} (batches {start} to {stop - 1} of "
                        f"the data): {err}") from err


def _update_all(collector: Collector, arrays: Mapping[str, np.ndarray], samples: BatchSamples,
                batched: frozenset[str]) -> None:
    for name, array in arrays.items():
        collector.update(name, *samples.split(array, name in batched))


def sample_axis_tensors(model: onnx.ModelProto, names: Iterable[str]) -> frozenset[str]:
    """The tensors among ``names`` whose axis 0 holds the samples: graph inputs, and the tensors
    whose first dimension shape inference names as the inputs' (e.g. ``N``), or sizes as their
    fixed batch. Decided from the model alone, so the same whatever the batch size.

    Args:
        model: A loaded model (shapes inferred).
        names: Value names.
    """
    specs = input_specs(model)
    batch_dims = {spec.shape[0] for spec in specs.values() if spec.shape} - {None}
    first_dims = {info.name: info.type.tensor_type.shape.dim[0] for info in
                  (*model.graph.input, *model.graph.value_info, *model.graph.output)
                  if info.type.HasField("tensor_type") and info.type.tensor_type.shape.dim}
    found = set()
    for name in names:
        dim = first_dims.get(name)
        size = None if dim is None else dim.dim_param if dim.HasField("dim_param") else (
            dim.dim_value if dim.HasField("dim_value") else None)
        if name in specs or (size is not None and size in batch_dims):
            found.add(name)
    return frozenset(found)


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
    import onnxruntime as ort  # core dependency, imported here to keep `import quantdbg.calibration` cheap

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
    import onnxruntime as ort  # core dependency, imported here to keep `import quantdbg.calibration` cheap

    try:
        with staged(model) as stage:  # external weights are read from their file, not re-serialised
            options = stage.configure(options if options is not None else ort.SessionOptions())
            return ort.InferenceSession(stage.source, sess_options=options,
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

