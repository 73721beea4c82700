"""Calibration and evaluation data: feed iterables, adapters, and checks against the model.

A *feed* maps each model input name to one batch (axis 0 is the batch). Data is anything that
iterates over feeds; :class:`ArrayData` holds whole arrays and re-batches them, which is what
makes results comparable across batch sizes.
"""
from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import numpy as np

from quantdbg.errors import DataError
from quantdbg.model import TensorSpec, input_specs

if TYPE_CHECKING:
    import onnx

Feed = Mapping[str, np.ndarray]

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

    Raises:
        DataError: The arrays are empty or disagree on the number of samples.
    """

    def __init__(self, arrays: Mapping[str, np.ndarray], batch_size: int | None = DEFAULT_BATCH_SIZE,
                 limit: int | None = None) -> None:
        self.arrays = {name: np.asarray(value) for name, value in arrays.items()}
        self.batch_size = batch_size
        self.limit = limit
        self._validate()

    def _validate(self) -> None:
        if not self.arrays:
            raise DataError("No input arrays were given; pass one array per model input.")
        lengths = {name: (a.shape[0] if a.ndim else 0) for name, a in self.arrays.items()}
        if len(set(lengths.values())) != 1:
            raise DataError(f"Inputs disagree on the number of samples (axis 0): {lengths}. "
                            "Every input needs one entry per sample.")
        if next(iter(lengths.values())) == 0:
            raise DataError("The calibration arrays hold no samples (axis 0 has length 0).")
        if self.batch_size is not None and self.batch_size < 1:
            raise DataError(f"batch_size must be >= 1, got {self.batch_size}.")

    def __len__(self) -> int:
        n = next(iter(self.arrays.values())).shape[0]
        return n if self.limit is None else min(n, self.limit)

    @property
    def num_batches(self) -> int:
        """How many feeds one iteration yields."""
        step = self.batch_size or len(self)
        return -(-len(self) // step)

    def __iter__(self) -> Iterator[Feed]:
        n = len(self)
        step = self.batch_size or n
        for start in range(0, n, step):
            yield {name: a[start:start + step] for name, a in self.arrays.items()}

    def with_batch_size(self, batch_size: int | None) -> ArrayData:
        """Returns the same samples served in batches of ``batch_size``."""
        return ArrayData(self.arrays, batch_size, self.limit)

    def subset(self, indices: np.ndarray) -> ArrayData:
        """Returns the samples at ``indices`` (e.g. a bootstrap resample)."""
        return ArrayData({k: v[:len(self)][indices] for k, v in self.arrays.items()}, self.batch_size)


class FeedList:
    """A re-iterable list of ready feeds (each its own dict: never ``[{}] * n``)."""

    def __init__(self, feeds: Iterable[Feed]) -> None:
        self.feeds = [dict(feed) for feed in feeds]
        if not self.feeds:
            raise DataError("The calibration data yielded no feeds; give at least one batch.")

    def __iter__(self) -> Iterator[Feed]:
        return iter(self.feeds)

    def __len__(self) -> int:
        return len(self.feeds)


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
        DataError: The file is missing, unreadable, holds pickled objects, or lacks an input.
    """
    path = Path(path)
    if not path.is_file():
        raise DataError(f"Data file {str(path)!r} does not exist.")
    try:
        with np.load(path, allow_pickle=False) as npz:
            keys = list(npz.files) if inputs is None else list(inputs)
            missing = [k for k in keys if k not in npz.files]
            if missing:
                raise DataError(f"{str(path)!r} has no array named {missing[0]!r} (it holds "
                                f"{sorted(npz.files)}); save one array per model input under its name.")
            arrays = {k: npz[k] for k in keys}
    except (OSError, ValueError) as err:
        raise DataError(f"Cannot read {str(path)!r} as .npz without pickle: {err}") from err
    return ArrayData(arrays, batch_size, limit)


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
    """:func:`as_data` for a loaded model's inputs, re-batched when the caller chose a size.

    Args:
        source: Anything :func:`as_data` accepts.
        model: The loaded model; only its (non-initializer) input names are read from an ``.npz``.
        batch_size: Samples per feed for paths and arrays (None: :data:`DEFAULT_BATCH_SIZE`).
            Ready feeds keep their own batches.

    Returns:
        Data that can be iterated more than once.

    Raises:
        DataError: ``batch_size`` is below 1, or the source is empty or of an unsupported type.
    """
    if batch_size is not None and batch_size < 1:
        raise DataError(f"batch_size must be >= 1, got {batch_size}.")
    feeds = as_data(source, batch_size or DEFAULT_BATCH_SIZE, inputs=list(input_specs(model)))
    if batch_size is not None and isinstance(feeds, ArrayData) and feeds.batch_size != batch_size:
        feeds = feeds.with_batch_size(batch_size)
    return feeds


def samples_in(feed: Feed) -> int:
    """Samples in one feed: axis 0 of its first input (1 for a scalar or an empty feed)."""
    first = next(iter(feed.values()), None)
    return int(first.shape[0]) if first is not None and first.ndim else 1


def check_feed(feed: Feed, specs: Mapping[str, TensorSpec], where: str = "feed") -> dict[str, np.ndarray]:
    """Checks one feed against the model's inputs and returns it as contiguous arrays.

    Args:
        feed: Input name -> array.
        specs: The model's inputs, from :func:`quantdbg.model.input_specs`.
        where: Names the feed in messages, e.g. ``"calibration batch 3"``.

    Returns:
        A new dict with C-contiguous arrays of the expected dtypes.

    Raises:
        DataError: A name is missing or unknown, or a dtype, rank or fixed dim is wrong.
    """
    if not isinstance(feed, Mapping):
        raise DataError(f"{where} is a {type(feed).__name__}, not a dict of input name -> array.")
    missing = [name for name in specs if name not in feed]
    extra = [name for name in feed if name not in specs]
    if missing:
        raise DataError(f"{where} lacks model input {missing[0]!r} (expected inputs: {list(specs)}).")
    if extra:
        raise DataError(f"{where} has {extra[0]!r}, which is not a model input (expected: {list(specs)}).")
    return {name: _check_array(np.asarray(feed[name]), spec, where) for name, spec in specs.items()}


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
