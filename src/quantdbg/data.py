"""Calibration and evaluation data: feed iterables, adapters, and checks against the model.

A *feed* maps each model input name to one batch (axis 0 is the batch). Data is anything that
iterates over feeds; :class:`ArrayData` holds whole arrays and re-batches them, which is what
makes results comparable across batch sizes.

Data is fitted to the model's inputs (:func:`fit_to_inputs`, which :func:`as_model_data` applies
for every command and API entry point): a model whose inputs have a fixed batch dimension ``b``
gets feeds of ``b`` samples whatever batch size was asked for, and a model whose inputs have no
batch axis at all gets one sample per feed, without the sample axis the data carries.
"""
from __future__ import annotations

import logging
import math
import os
import warnings
import zipfile
import zlib
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import numpy as np

from quantdbg.errors import DataError, QuantDbgWarning
from quantdbg.model.specs import TensorSpec, input_specs

if TYPE_CHECKING:
    import onnx

logger = logging.getLogger(__name__)

Feed = Mapping[str, np.ndarray]


class SampleFeed(dict):  # type: ignore[type-arg]
    """A feed holding one sample of a model whose inputs have no batch axis (no sample axis either).

    Its axis 0 is the model's own first axis (e.g. a sequence), so it counts as one sample
    (:func:`samples_in`), and :func:`check_feed` keeps its type.
    """

DEFAULT_BATCH_SIZE = 32
"""Samples per feed when arrays or an ``.npz`` are batched and the caller chose no size."""


@runtime_checkable
class CalibrationData(Protocol):
    """Anything that yields feeds; iterating it again must yield the same feeds again."""

    def __iter__(self) -> Iterator[Feed]: ...


class ArrayData:
    """Whole input arrays (samples on axis 0), served in batches of ``batch_size``.

    Args:
        arrays: Input name -> array; every array has the same length on axis 0.
        batch_size: Samples per feed; the last feed may be smaller. None serves one feed.
        limit: Use only the first ``limit`` samples.
        unbatched: The model's inputs have no batch axis: serve one sample per feed, without its
            sample axis (as a :class:`SampleFeed`); ``batch_size`` is then ignored.

    Raises:
        DataError: The arrays are empty or disagree on the number of samples.
    """

    def __init__(self, arrays: Mapping[str, np.ndarray], batch_size: int | None = DEFAULT_BATCH_SIZE,
                 limit: int | None = None, *, unbatched: bool = False) -> None:
        self.arrays = {name: np.asarray(value) for name, value in arrays.items()}
        self.batch_size = batch_size
        self.limit = limit
        self.unbatched = unbatched
        self._validate()

    def _validate(self) -> None:
        if not self.arrays:
            raise DataError("No input arrays were given; pass one array per model input.")
        lengths = {name: (a.shape[0] if a.ndim else 0) for name, a in self.arrays.items()}
        if len(set(lengths.values())) != 1:
            raise DataError(f"Inputs disagree on the number of samples (axis 0): {lengths}. "
                            "Every input needs one entry per sample.")
        if next(iter(lengths.values())) == 0:
            raise DataError("The data arrays hold no samples (axis 0 has length 0).")
        if self.batch_size is not None and self.batch_size < 1:
            raise DataError(f"batch_size must be >= 1, got {self.batch_size}.")

    def __len__(self) -> int:
        n = next(iter(self.arrays.values())).shape[0]
        return n if self.limit is None else min(n, self.limit)

    @property
    def num_batches(self) -> int:
        """How many feeds one iteration yields."""
        if self.unbatched:
            return len(self)
        step = self.batch_size or len(self)
        return -(-len(self) // step)

    def __iter__(self) -> Iterator[Feed]:
        n = len(self)
        if self.unbatched:
            for index in range(n):
                yield SampleFeed({name: a[index] for name, a in self.arrays.items()})
            return
        step = self.batch_size or n
        for start in range(0, n, step):  # the last feed stops at the limit too
            yield {name: a[start:min(start + step, n)] for name, a in self.arrays.items()}

    def with_batch_size(self, batch_size: int | None) -> ArrayData:
        """Returns the same samples served in batches of ``batch_size``."""
        return ArrayData(self.arrays, batch_size, self.limit, unbatched=self.unbatched)

    def subset(self, indices: np.ndarray) -> ArrayData:
        """Returns the samples at ``indices`` (e.g. a bootstrap resample)."""
        return ArrayData({k: v[:len(self)][indices] for k, v in self.arrays.items()}, self.batch_size,
                         unbatched=self.unbatched)

    def shard(self, index: int, count: int) -> ArrayData:
        """The ``index``-th of ``count`` runs of whole feeds (see :func:`shard_bounds`): the same feeds,
        cut the same way, as iterating all of the data yields there; the arrays are views."""
        start, stop = shard_bounds(self.num_batches, index, count)
        step = 1 if self.unbatched else (self.batch_size or len(self))
        lo, hi = start * step, min(stop * step, len(self))
        return ArrayData({k: v[lo:hi] for k, v in self.arrays.items()}, self.batch_size,
                         unbatched=self.unbatched)

    def head(self, batches: int) -> ArrayData:
        """The first ``batches`` feeds' samples."""
        step = 1 if self.unbatched else (self.batch_size or len(self))
        return ArrayData(self.arrays, self.batch_size, min(len(self), batches * step),
                         unbatched=self.unbatched)


class FeedList:
    """A re-iterable list of ready feeds (each its own dict: never ``[{}] * n``)."""

    def __init__(self, feeds: Iterable[Feed]) -> None:
        self.feeds = [SampleFeed(feed) if isinstance(feed, SampleFeed) else dict(feed) for feed in feeds]
        if not self.feeds:
            raise DataError("The calibration data yielded no feeds; give at least one batch.")

    def __iter__(self) -> Iterator[Feed]:
        return iter(self.feeds)

    def __len__(self) -> int:
        return len(self.feeds)

    @property
    def num_batches(self) -> int:
        """How many feeds one iteration yields."""
        return len(self.feeds)

    def shard(self, index: int, count: int) -> FeedList:
        """The ``index``-th of ``count`` runs of feeds (see :func:`shard_bounds`)."""
        start, stop = shard_bounds(len(self.feeds), index, count)
        return FeedList(self.feeds[start:stop])

    def head(self, batches: int) -> FeedList:
        """The first ``batches`` feeds."""
        return FeedList(self.feeds[:batches])


@runtime_checkable
class ShardableData(CalibrationData, Protocol):
    """Data that can be cut into runs of feeds, each collected apart (e.g. on other machines).

    ``shard(i, n)`` for ``i`` in ``range(n)`` must yield, one after the other, exactly the feeds one
    iteration of the whole yields: sharded statistics then merge into the same bits.
    """

    @property
    def num_batches(self) -> int: ...

    def shard(self, index: int, count: int) -> CalibrationData: ...


def shard_bounds(n_batches: int, index: int, count: int) -> tuple[int, int]:
    """Feeds ``[start, stop)`` of shard ``index`` of ``count``: consecutive runs, the first
    ``n_batches % count`` of them one feed longer (``count`` is capped at ``n_batches``).

    Raises:
        DataError: ``index`` is not in ``range(count)``.
    """
    count = max(1, min(count, n_batches))
    if not 0 <= index < count:
        raise DataError(f"Shard {index} does not exist: the data is cut into {count} shard(s).")
    size, extra = divmod(n_batches, count)
    start = index * size + min(index, extra)
    return start, start + size + (1 if index < extra else 0)


DataSource = str | os.PathLike | Mapping[str, np.ndarray] | CalibrationData | Iterable[Feed]


def load_npz(path: str | os.PathLike, batch_size: int | None = DEFAULT_BATCH_SIZE, limit: int | None = None,
             inputs: Iterable[str] | None = None) -> ArrayData:
    """Reads an ``.npz`` mapping input names to arrays (samples on axis 0).

    Args:
        path: The file; read with ``allow_pickle=False``.
        batch_size: Samples per feed.
        limit: Use only the first ``limit`` samples.
        inputs: Keep only these keys (e.g. the model's input names); others such as labels are
            ignored. None keeps every key.

    Returns:
        The arrays as :class:`ArrayData`.

    Raises:
        DataError: The file is missing, unreadable, holds pickled objects, holds no samples, or
            lacks an input.
    """
    arrays = read_npz(path, inputs)
    empty = [name for name, array in arrays.items() if array.ndim == 0 or array.shape[0] == 0]
    if arrays and len(empty) == len(arrays):
        raise DataError(f"{str(path)!r} holds no samples (axis 0 of {empty[0]!r} has length 0); save at "
                        "least one sample per input.")
    return ArrayData(arrays, batch_size, limit)


# The most a deflate stream expands (RFC 1951's limit is about 1032:1); a member claiming more is
# forged, and is refused before anything is allocated.
_MAX_DEFLATE_RATIO = 1100
_NPY_MAGIC = b"\x93NUMPY"


def read_npz(path: str | os.PathLike, keys: Iterable[str] | None = None) -> dict[str, np.ndarray]:
    """Reads arrays of an ``.npz`` without pickle, checking every declared size against the file first.

    Args:
        path: The file.
        keys: The arrays to read (None: all).

    Returns:
        Name -> array, in the order of ``keys`` (or of the file).

    Raises:
        DataError: The file is missing, empty, a lone ``.npy``, not a zip, holds no arrays or
            object arrays, declares more data than it holds, or lacks one of ``keys``.
    """
    path = Path(path)
    if not path.is_file():
        raise DataError(f"Data file {str(path)!r} does not exist.")
    where = repr(str(path))
    with path.open("rb") as head:
        magic = head.read(len(_NPY_MAGIC))
    if not magic:
        raise DataError(f"Data file {where} is empty; save the arrays with numpy.savez(path, name=array).")
    if magic == _NPY_MAGIC:
        raise DataError(f"Data file {where} is a single .npy array, not an .npz; save it with "
                        "numpy.savez(path, input_name=array), one array per model input.")
    try:
        with zipfile.ZipFile(path) as archive:
            members = {info.filename[:-4]: info for info in archive.infolist()
                       if info.filename.endswith(".npy")}
            if not members:
                raise DataError(f"Data file {where} holds no arrays; save one array per model input.")
            wanted = list(members) if keys is None else list(keys)
            missing = [k for k in wanted if k not in members]
            if missing:
                raise DataError(f"{where} has no array named {missing[0]!r} (it holds {sorted(members)}); "
                                "save one array per model input under its name.")
            for key in wanted:
                _check_member(archive, members[key], key, where)
        with np.load(path, allow_pickle=False) as npz:
            return {k: npz[k] for k in wanted}
    except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile, zlib.error) as err:
        if isinstance(err, DataError):
            raise
        raise DataError(f"Cannot read {where} as .npz without pickle: {err}") from err


def _check_member(archive: zipfile.ZipFile, info: zipfile.ZipInfo, key: str, where: str) -> None:
    """Refuses object arrays and declared sizes the member cannot hold, before np.load allocates."""
    with archive.open(info) as member:
        version = np.lib.format.read_magic(member)
        fmt = np.lib.format
        read = fmt.read_array_header_1_0 if version == (1, 0) else fmt.read_array_header_2_0
        shape, _, dtype = read(member)
        header = member.tell()
    if dtype.hasobject:
        raise DataError(f"{where}: array {key!r} holds Python objects (dtype {dtype}), which are never "
                        "unpickled; save numeric arrays.")
    declared = math.prod(shape) * dtype.itemsize
    expands = info.compress_type != zipfile.ZIP_STORED and info.file_size > _MAX_DEFLATE_RATIO * (
        info.compress_size + 1)
    if declared > info.file_size - header or expands:
        raise DataError(f"{where}: array {key!r} declares shape {tuple(shape)} of {dtype} ({declared} "
                        "bytes), more than the file holds; the file is truncated or corrupt.")


def as_data(source: DataSource, batch_size: int | None = DEFAULT_BATCH_SIZE,
            inputs: Iterable[str] | None = None) -> CalibrationData:
    """Turns a path, a dict of arrays, a feed list or a generator into re-iterable data.

    Args:
        source: ``.npz`` path; input name -> array mapping; a re-iterable of feeds (used as is);
            or a one-shot iterator/generator of feeds (materialised once, so every pass sees
            the same batches).
        batch_size: Samples per feed for paths and arrays.
        inputs: Input names to keep from an ``.npz``.

    Returns:
        Data that can be iterated more than once.

    Raises:
        DataError: The source is empty or of an unsupported type.
    """
    if isinstance(source, (str, os.PathLike)):
        return load_npz(source, batch_size, inputs=inputs)
    if isinstance(source, Mapping):
        if source and all(isinstance(v, np.ndarray) for v in source.values()):
            return ArrayData(source, batch_size)
        raise DataError("A mapping of data must map input names to NumPy arrays.")
    if isinstance(source, (ArrayData, FeedList)):
        return source
    if isinstance(source, Iterator):
        return FeedList(source)
    if isinstance(source, Iterable):
        return FeedList(source) if isinstance(source, (list, tuple)) else source
    raise DataError(f"Unsupported data of type {type(source).__name__}; pass an .npz path, a dict of "
                    "arrays, or an iterable of feed dicts.")


def as_model_data(source: DataSource, model: onnx.ModelProto,
                  batch_size: int | None = None) -> CalibrationData:
    """:func:`as_data` for a loaded model's inputs, re-batched when the caller chose a size, and
    fitted to the inputs' batch axes (:func:`fit_to_inputs`).

    Args:
        source: Anything :func:`as_data` accepts.
        model: The loaded model; only its (non-initializer) input names are read from an ``.npz``.
        batch_size: Samples per feed for paths and arrays (None: :data:`DEFAULT_BATCH_SIZE`).
            Ready feeds keep their own batches. A fixed batch dimension overrides it.

    Returns:
        Data that can be iterated more than once.

    Raises:
        DataError: ``batch_size`` is below 1, the source is empty or of an unsupported type, or it
            holds fewer samples than the model's fixed batch dimension.
    """
    if batch_size is not None and batch_size < 1:
        raise DataError(f"batch_size must be >= 1, got {batch_size}.")
    specs = input_specs(model)
    feeds = as_data(source, batch_size or DEFAULT_BATCH_SIZE, inputs=list(specs))
    refuse_nonfinite(feeds, repr(str(source)) if isinstance(source, (str, os.PathLike)) else "The data")
    if batch_size is not None and isinstance(feeds, ArrayData) and feeds.batch_size != batch_size:
        feeds = feeds.with_batch_size(batch_size)
    return fit_to_inputs(feeds, specs)


def refuse_nonfinite(data: CalibrationData, origin: str) -> None:
    """Refuses NaN/Inf in whole arrays or ready feeds, naming the input and the first sample holding
    one (counted from 0 over all of the data); other iterables are checked feed by feed
    (:func:`check_feed`).

    Args:
        data: Data from :func:`as_data`.
        origin: Names the data in the message (e.g. the file).

    Raises:
        DataError: A floating-point input holds NaN or Inf.
    """
    if isinstance(data, ArrayData):
        for name, array in data.arrays.items():
            _check_finite(array[:len(data)], name, origin, 0, per_sample=True)
    elif isinstance(data, FeedList):
        first = 0
        for feed in data.feeds:
            batched = not isinstance(feed, SampleFeed)
            for name, array in feed.items():
                _check_finite(np.asarray(array), name, origin, first, per_sample=batched)
            first += samples_in(feed)


@dataclass(frozen=True)
class FeedLayout:
    """How samples must be cut into feeds for a model's inputs.

    Attributes:
        batch: The inputs' fixed batch dimension (None: any batch size fits).
        unbatched: The inputs have no batch axis; the data has one axis more (the samples).
    """

    batch: int | None = None
    unbatched: bool = False


def feed_layout(shapes: Mapping[str, tuple[int, ...]], specs: Mapping[str, TensorSpec]) -> FeedLayout:
    """The layout data of these shapes (samples or batches on axis 0) needs for the model's inputs.

    Every input the data holds must agree: all with one axis more than the model's input
    (unbatched), or all of the model's rank with axis 0 fixed to one size in every input. Anything
    else gets the default layout, and :func:`check_feed` names the mismatch.

    Args:
        shapes: Input name -> shape of the data for it.
        specs: The model's inputs.
    """
    common = [name for name in specs if name in shapes]
    if not common:
        return FeedLayout()
    extra = {len(shapes[name]) - len(specs[name].shape) for name in common}
    if extra == {1}:
        return FeedLayout(unbatched=True)
    # Axis 0 is a batch only if every input fixes it to the same size: in a sequence model whose
    # state inputs are (1, 1, H) and whose signal is (T, F), axis 0 of the signal is time, and
    # cutting it into batches of 1 would feed single frames.
    fixed = {specs[name].fixed_batch for name in common}
    if extra == {0} and len(fixed) == 1 and None not in fixed:
        return FeedLayout(batch=fixed.pop())
    return FeedLayout()


def fit_to_inputs(data: CalibrationData, specs: Mapping[str, TensorSpec]) -> CalibrationData:
    """Serves ``data`` in the feeds the model's inputs take (see :func:`feed_layout`).

    Whole arrays (:class:`ArrayData`) and feed lists are fitted: with a fixed batch dimension ``b``
    they are served ``b`` samples per feed (a last partial batch is left out with a warning), and
    data with one axis more than unbatched inputs is served one sample per feed without that axis.
    One log line says which. Other iterables are served as they are.

    Args:
        data: Data from :func:`as_data`.
        specs: The model's inputs (:func:`quantdbg.model.specs.input_specs`).

    Returns:
        ``data`` itself when it fits, else the fitted data.

    Raises:
        DataError: There are fewer samples than the fixed batch dimension.
    """
    if isinstance(data, ArrayData):
        return _fit_arrays(data, specs)
    if isinstance(data, FeedList) and data.feeds:
        return _fit_feeds(data, specs)
    return data


def _shapes(feed: Feed) -> dict[str, tuple[int, ...]]:
    return {name: tuple(np.shape(value)) for name, value in feed.items()}


def _fixed_input(specs: Mapping[str, TensorSpec], batch: int) -> str:
    return next(name for name, spec in specs.items() if spec.fixed_batch == batch)


def _fit_arrays(data: ArrayData, specs: Mapping[str, TensorSpec]) -> ArrayData:
    layout = feed_layout(_shapes(data.arrays), specs)
    if layout.unbatched and not data.unbatched:
        logger.info("The model's inputs have no batch axis and the data one axis more: feeding its %d "
                    "samples one at a time, without the sample axis.", len(data))
        return ArrayData(data.arrays, data.batch_size, data.limit, unbatched=True)
    if layout.batch is None or data.unbatched:
        return data
    n, b = len(data), layout.batch
    kept = n - n % b
    if kept == 0:
        raise DataError(f"Input {_fixed_input(specs, b)!r} has a fixed batch dimension of {b}, but the data "
                        f"holds only {n} sample(s); give at least {b}.")
    if data.batch_size == b and kept == n:
        return data
    if data.batch_size != b:
        logger.info("Input %r has a fixed batch dimension of %d: feeding %d sample(s) per batch "
                    "(batch size %s asked).", _fixed_input(specs, b), b, b, data.batch_size or n)
    if kept < n:
        warnings.warn(f"Input {_fixed_input(specs, b)!r} has a fixed batch dimension of {b}: the last "
                      f"{n - kept} of {n} samples do not fill a batch and are left out.", QuantDbgWarning,
                      stacklevel=4)
    return ArrayData(data.arrays, b, kept)


def _fit_feeds(data: FeedList, specs: Mapping[str, TensorSpec]) -> FeedList:
    if isinstance(data.feeds[0], SampleFeed):
        return data  # fitted already
    layout = feed_layout(_shapes(data.feeds[0]), specs)
    if layout.unbatched:
        logger.info("The model's inputs have no batch axis and each feed one axis more: feeding its "
                    "samples one at a time, without the sample axis.")
        return FeedList(SampleFeed({name: a[i] for name, a in feed.items()})
                        for feed in data.feeds for i in range(samples_in(feed)))
    b = layout.batch
    if b is None or all(samples_in(feed) == b for feed in data.feeds):
        return data
    logger.info("Input %r has a fixed batch dimension of %d: cutting the feeds into batches of %d.",
                _fixed_input(specs, b), b, b)
    cut = [{name: a[start:start + b] for name, a in feed.items()}
           for feed in data.feeds for start in range(0, samples_in(feed) - b + 1, b)]
    dropped = sum(samples_in(feed) % b for feed in data.feeds)
    if dropped:
        warnings.warn(f"Input {_fixed_input(specs, b)!r} has a fixed batch dimension of {b}: {dropped} "
                      "sample(s) at the ends of feeds do not fill a batch and are left out.", QuantDbgWarning,
                      stacklevel=4)
    if not cut:
        raise DataError(f"Input {_fixed_input(specs, b)!r} has a fixed batch dimension of {b}, but no feed "
                        f"holds {b} sample(s).")
    return FeedList(cut)


def samples_in(feed: Feed) -> int:
    """Samples in one feed: axis 0 of its first input (1 for a :class:`SampleFeed`, a scalar or an
    empty feed)."""
    if isinstance(feed, SampleFeed):
        return 1
    first = next(iter(feed.values()), None)
    return int(first.shape[0]) if first is not None and first.ndim else 1


def check_feed(feed: Feed, specs: Mapping[str, TensorSpec], where: str = "feed",
               first_sample: int | None = None) -> dict[str, np.ndarray]:
    """Checks one feed against the model's inputs and returns it as contiguous arrays.

    Args:
        feed: Input name -> array.
        specs: The model's inputs, from :func:`quantdbg.model.specs.input_specs`.
        where: Names the feed in messages, e.g. ``"calibration batch 3"``.
        first_sample: The index of the feed's first sample in the whole data, for messages (None:
            samples are counted within the feed).

    Returns:
        A new dict with C-contiguous arrays of the expected dtypes.

    Raises:
        DataError: A name is missing or unknown, a dtype, rank or fixed dim is wrong, or a
            floating-point input holds NaN or Inf.
    """
    if not isinstance(feed, Mapping):
        raise DataError(f"{where} is a {type(feed).__name__}, not a dict of input name -> array.")
    missing = [name for name in specs if name not in feed]
    extra = [name for name in feed if name not in specs]
    if missing:
        raise DataError(f"{where} lacks model input {missing[0]!r} (expected inputs: {list(specs)}).")
    if extra:
        raise DataError(f"{where} has {extra[0]!r}, which is not a model input (expected: {list(specs)}).")
    checked = {name: _check_array(np.asarray(feed[name]), spec, where) for name, spec in specs.items()}
    for name, array in checked.items():
        _check_finite(array, name, where, first_sample, per_sample=not isinstance(feed, SampleFeed))
    return SampleFeed(checked) if isinstance(feed, SampleFeed) else checked


def _check_finite(array: np.ndarray, name: str, where: str, first: int | None, per_sample: bool) -> None:
    """Refuses NaN/Inf in a floating-point array whose axis 0 holds samples (``per_sample``) or that
    is one sample; ``first`` is the index of its first sample (None: counted within the array)."""
    if array.dtype.kind != "f" or array.size == 0:
        return
    if np.isfinite(array.min()) and np.isfinite(array.max()):  # NaN and Inf reach min or max: no temporaries
        return
    bad = ~np.isfinite(array)
    local = int(np.argmax(bad.reshape(array.shape[0], -1).any(axis=1))) if per_sample and array.ndim else 0
    sample = f"sample {local} of this feed" if first is None else f"sample {first + local} (counted from 0)"
    raise DataError(f"{where}: input {name!r} holds {int(np.count_nonzero(bad))} NaN/Inf value(s), the first "
                    f"in {sample}; NaN and Inf cannot be calibrated or evaluated. Remove or repair that "
                    "sample, or check the preprocessing.")


def _check_array(array: np.ndarray, spec: TensorSpec, where: str) -> np.ndarray:
    if array.dtype != spec.dtype:
        raise DataError(f"{where}: input {spec.name!r} expects dtype {spec.dtype}, got {array.dtype}. "
                        f"Convert it with .astype(np.{spec.dtype.name}).")
    if array.ndim != len(spec.shape):
        raise DataError(f"{where}: input {spec.name!r} expects rank {len(spec.shape)} {_shape(spec)}, "
                        f"got shape {array.shape}.")
    for axis, (want, got) in enumerate(zip(spec.shape, array.shape, strict=False)):
        if isinstance(want, int) and want > 0 and want != got:
            raise DataError(f"{where}: input {spec.name!r} expects {want} on axis {axis} "
                            f"{_shape(spec)}, got shape {array.shape}.")
    return np.ascontiguousarray(array)


def _shape(spec: TensorSpec) -> str:
    return "(" + ", ".join("?" if d is None else str(d) for d in spec.shape) + ")"
