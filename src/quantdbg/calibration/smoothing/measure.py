"""Per-channel max |x| of activations, measured in one streamed ONNX Runtime pass."""
from __future__ import annotations

import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import numpy as np

from quantdbg.calibration.collect import ActivationStream, check_activations
from quantdbg.data import DataSource
from quantdbg.errors import DataError, QuantDbgWarning
from quantdbg.model.load import ModelSource, as_loaded


@dataclass(frozen=True)
class ChannelAbsmax:
    """Per-channel max |x| (channels on the last axis) of activation tensors.

    Attributes:
        absmax: Tensor name -> float64 vector of max |x| per channel, over every finite value.
        nonfinite: Tensor name -> NaN/Inf values seen (left out of ``absmax``).
        n_batches: Feeds consumed.
        n_samples: Samples consumed (axis 0 of the first input, summed).
    """

    absmax: Mapping[str, np.ndarray]
    nonfinite: Mapping[str, int]
    n_batches: int
    n_samples: int


def collect_channel_absmax(model: ModelSource, data: DataSource, tensors: Iterable[str], *,
                           max_batches: int | None = None, progress: bool = False,
                           session_options: Any = None) -> ChannelAbsmax:
    """Streams ``data`` through ``model`` and keeps each tensor's per-channel max |x|.

    Channels are the last axis. Each batch is reduced to one vector per tensor and dropped, so
    memory does not grow with the number of samples, and the result (a max) does not depend on
    batching or order.

    Args:
        model: Path or ModelProto (never modified; a copy exposes the tensors as outputs).
        data: Feeds (see :func:`quantdbg.data.as_data`); iterated once.
        tensors: Value names (graph inputs allowed).
        max_batches: Stop after this many feeds (None: all).
        progress: Show a progress bar.
        session_options: ``onnxruntime.SessionOptions``.

    Returns:
        Per-channel max |x| and NaN/Inf counts per tensor, with batch and sample counts.

    Raises:
        ModelError: A tensor name is unknown or names an initializer.
        DataError: A feed does not match the model, a tensor is not float or changes its channel
            count, or there is no data.
        BackendError: ONNX Runtime failed.
    """
    loaded = as_loaded(model).proto
    names = list(dict.fromkeys(tensors))
    check_activations(loaded, names, "; per-channel ranges are measured on activations only "
                      "(a weight's range comes from its values).")
    stream = ActivationStream(loaded, names, "smoothing", session_options)
    absmax: dict[str, np.ndarray] = {}
    nonfinite = dict.fromkeys(names, 0)
    for arrays in stream.batches(data, max_batches, progress):
        for name, array in arrays.items():
            _reduce_into(absmax, nonfinite, name, array)
    for name, count in nonfinite.items():
        if count:
            warnings.warn(f"Tensor {name!r}: {count} NaN/Inf value(s) were left out of its per-channel "
                          "ranges. Check the model and the calibration data.", QuantDbgWarning, stacklevel=2)
    return ChannelAbsmax(MappingProxyType(absmax), MappingProxyType(nonfinite), stream.n_batches,
                         stream.n_samples)


def _reduce_into(absmax: dict[str, np.ndarray], nonfinite: dict[str, int], name: str,
                 array: np.ndarray) -> None:
    """Folds one batch of ``name`` into its per-channel max |x| (channels on the last axis)."""
    array = np.asarray(array)
    if not np.issubdtype(array.dtype, np.floating) or array.ndim == 0:
        raise DataError(f"Tensor {name!r} holds {array.dtype} values of shape {array.shape}; only float "
                        "tensors with a channel axis can be smoothed.")
    flat = array.reshape(-1, array.shape[-1])
    # max and -min avoid materialising |x| (one temporary the size of the batch per tensor).
    batch = np.maximum(flat.max(axis=0), -flat.min(axis=0)).astype(np.float64)
    if not np.all(np.isfinite(batch)):
        finite = np.isfinite(flat)
        nonfinite[name] += int(finite.size - np.count_nonzero(finite))
        batch = np.where(finite, np.abs(flat), 0.0).max(axis=0).astype(np.float64)
    previous = absmax.get(name)
    if previous is not None and previous.shape != batch.shape:
        raise DataError(f"Tensor {name!r} had {previous.shape[0]} channels (last axis) in earlier batches "
                        f"and {batch.shape[0]} now; its channel count must be fixed to be smoothed.")
    absmax[name] = batch if previous is None else np.maximum(previous, batch)
