"""Lazy external weights: a model read from a file keeps its external weights in their data file.

Protobuf cannot hold more than 2 GB, and a copy of every weight in memory is what makes large
models expensive, so :func:`~quantdbg.model.load_model` leaves tensors stored as external data
where they are. Each such tensor records the folder its ``location`` is relative to under onnx's
own ``basepath`` external-data key, so the tensor stays readable wherever it travels (a copy, an
onnx-graphsurgeon graph, a variant built for sensitivity analysis) and only the weights a stage
needs are read, one at a time (:func:`tensor_array`). ONNX Runtime does not know that key: sessions
are built from a copy without it (:mod:`quantdbg.model.staging`).
"""
from __future__ import annotations

import functools
import hashlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import onnx_graphsurgeon as gs
from onnx import external_data_helper, numpy_helper
from onnx_graphsurgeon.ir.tensor import LazyValues

TWO_GB = 2**31 - 1
"""Protobuf's limit on one serialised message."""
BASE_KEY = "basepath"
"""The external-data key (part of onnx's spec) naming the folder ``location`` is relative to."""


def all_tensors(model: onnx.ModelProto) -> Iterator[onnx.TensorProto]:
    """Every TensorProto of ``model``: initializers and node attributes, subgraphs included."""
    return external_data_helper._get_all_tensors(model)


def is_external(tensor: onnx.TensorProto) -> bool:
    """True when the tensor's values live in an external data file."""
    return external_data_helper.uses_external_data(tensor)


def _info(tensor: onnx.TensorProto) -> dict[str, str]:
    return {entry.key: entry.value for entry in tensor.external_data}


def base_of(tensor: onnx.TensorProto) -> str:
    """The folder an external tensor's ``location`` is relative to ("" when not recorded)."""
    return _info(tensor).get(BASE_KEY, "")


def location_of(tensor: onnx.TensorProto) -> str:
    """An external tensor's data file, relative to its :func:`base_of` folder."""
    return _info(tensor).get("location", "")


def set_base(tensor: onnx.TensorProto, base: str) -> None:
    """Records ``base`` as the folder an external tensor's ``location`` is relative to (in place)."""
    _set_entry(tensor, BASE_KEY, base)


def mark_lazy(model: onnx.ModelProto, base: str | os.PathLike) -> int:
    """Records ``base`` as the folder of every external tensor of ``model`` (in place).

    Call it only after the locations were checked to stay inside ``base`` (the loader does).

    Returns:
        The number of external tensors.
    """
    folder = str(Path(base).resolve())
    count = 0
    for tensor in all_tensors(model):
        if is_external(tensor):
            _set_entry(tensor, BASE_KEY, folder)
            count += 1
    return count


def _set_entry(tensor: onnx.TensorProto, key: str, value: str) -> None:
    for entry in tensor.external_data:
        if entry.key == key:
            entry.value = value
            return
    entry = tensor.external_data.add()
    entry.key, entry.value = key, value


def check_data_files(model: onnx.ModelProto) -> None:
    """Checks that every external tensor's bytes lie inside its data file (without reading them).

    Raises:
        OSError: A data file is missing, not a regular file, or unreadable.
        ValueError: A tensor's offset and length run past the end of its data file.
    """
    sizes: dict[Path, int] = {}
    for tensor in all_tensors(model):
        if not is_external(tensor):
            continue
        info = _info(tensor)
        path = Path(info.get(BASE_KEY, "")) / info.get("location", "")
        if path not in sizes:
            if not path.is_file():  # a folder's st_size would pass the length check below
                raise OSError(f"data file {str(path)!r} of tensor {tensor.name!r} "
                              f"{'is not a regular file' if path.exists() else 'does not exist'}")
            sizes[path] = path.stat().st_size
        end = int(info.get("offset", 0)) + tensor_nbytes(tensor)
        if end > sizes[path]:
            raise ValueError(f"tensor {tensor.name!r} needs bytes up to {end} of {str(path)!r}, "
                             f"which holds {sizes[path]}")


def external_bases(model: onnx.ModelProto) -> set[str]:
    """The folders the external tensors of ``model`` read from."""
    return {base_of(t) for t in all_tensors(model) if is_external(t)}


def data_files(model: onnx.ModelProto) -> tuple[Path, ...]:
    """The data files the external tensors of a lazily loaded ``model`` read, sorted, each once
    (``basepath`` / ``location``; a tensor without ``basepath`` names a file relative to the
    working directory)."""
    return tuple(sorted({Path(base_of(t)) / _info(t).get("location", "") for t in all_tensors(model)
                         if is_external(t)}))


def strip_bases(model: onnx.ModelProto | onnx.TensorProto) -> None:
    """Removes the ``basepath`` entries (in place), for a copy handed to ONNX Runtime or saved."""
    tensors = [model] if isinstance(model, onnx.TensorProto) else all_tensors(model)
    for tensor in tensors:
        if is_external(tensor):
            kept = [(e.key, e.value) for e in tensor.external_data if e.key != BASE_KEY]
            del tensor.external_data[:]
            for key, value in kept:
                entry = tensor.external_data.add()
                entry.key, entry.value = key, value


def tensor_array(tensor: onnx.TensorProto) -> np.ndarray:
    """The values of ``tensor``, read from its data file when external (the tensor is unchanged).

    External bytes are read here rather than by onnx, whose reader refuses a data file with more
    than one hard link (a backup made with ``cp -l`` or ``rsync --link-dest``, a store that
    deduplicates, the staging of :mod:`quantdbg.model.staging`); the loader has already checked
    that the file lies inside the model's folder.
    """
    if not is_external(tensor):
        return numpy_helper.to_array(tensor)
    raw = tensor_bytes(tensor)
    if tensor.data_type in _PACKED or tensor.data_type == onnx.TensorProto.STRING:
        return numpy_helper.to_array(_inline_copy(tensor, raw))
    dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type))
    array = np.frombuffer(raw, dtype, count=int(np.prod(tensor.dims, dtype=np.int64)))
    return (array.byteswap() if sys.byteorder == "big" else array).reshape(tuple(tensor.dims))


# Element types stored several to a byte: numpy_helper unpacks them.
_PACKED = frozenset(getattr(onnx.TensorProto, name) for name in (
    "INT4", "UINT4", "FLOAT4E2M1", "INT2", "UINT2", "FLOAT6E2M3", "FLOAT6E3M2")
    if hasattr(onnx.TensorProto, name))


def _inline_copy(tensor: onnx.TensorProto, raw: bytes) -> onnx.TensorProto:
    """A copy of an external ``tensor`` holding ``raw`` as its values."""
    copy = onnx.TensorProto()
    copy.CopyFrom(tensor)
    del copy.external_data[:]
    copy.data_location = onnx.TensorProto.DEFAULT
    copy.raw_data = raw
    return copy


INLINE_BELOW = 1024
"""External tensors smaller than this many bytes are read into memory when a model is loaded:
shape inference must see small constants (Reshape's shape, Slice's bounds), and onnx's own
``save_model(..., save_as_external_data=True)`` keeps tensors below this size inline by default, so
a model saved with ``size_threshold=0`` loads as the same model saved with onnx's defaults."""


def inline_small(model: onnx.ModelProto, below: int = INLINE_BELOW) -> int:
    """Reads every external tensor of fewer than ``below`` bytes into ``model`` (in place).

    Call it after the data files were checked (:func:`check_data_files`).

    Returns:
        The number of tensors read.
    """
    count = 0
    for tensor in all_tensors(model):
        if is_external(tensor) and tensor_nbytes(tensor) < below:
            tensor.CopyFrom(_inline_copy(tensor, tensor_bytes(tensor)))
            count += 1
    return count


def tensor_bytes(tensor: onnx.TensorProto) -> bytes:
    """The tensor's values as raw little-endian bytes (ONNX's ``raw_data`` layout)."""
    if is_external(tensor):
        info = _info(tensor)
        with open(Path(info.get(BASE_KEY, "")) / info["location"], "rb") as data:
            data.seek(int(info.get("offset", 0)))
            length = info.get("length")
            return data.read(int(length) if length is not None else tensor_nbytes(tensor))
    if tensor.HasField("raw_data"):
        return tensor.raw_data
    return numpy_helper.to_array(tensor).tobytes()


def tensor_nbytes(tensor: onnx.TensorProto) -> int:
    """The size of the tensor's values in bytes, without reading them."""
    if is_external(tensor):
        length = _info(tensor).get("length")
        if length is not None:
            return int(length)
    if tensor.data_type != onnx.TensorProto.STRING:
        try:
            itemsize = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type)).itemsize
            return int(np.prod(tensor.dims, dtype=np.int64)) * itemsize
        except (KeyError, TypeError, ValueError):  # an element type numpy cannot describe
            pass
    return tensor.ByteSize()


def fits_in_protobuf(model: onnx.ModelProto) -> bool:
    """True when ``model`` serialises to under 2 GB (the protobuf limit for in-memory checks).

    External tensors cost only their reference. ``ByteSize()`` walks the whole message (about
    0.3 s for a 90 MB model) and fails past 2 GB, so the in-memory payload is summed first and the
    exact size asked for only between 1 and 2 GB.
    """
    payload = inline_bytes(model)
    if payload < TWO_GB // 2:
        return True
    if payload >= TWO_GB:
        return False
    try:
        return model.ByteSize() < TWO_GB
    except Exception:  # protobuf's EncodeError past 2 GB, whatever its module
        return False


def weight_bytes(model: onnx.ModelProto) -> int:
    """Bytes held by the initializers of ``model`` (external ones counted by their length)."""
    return sum(tensor_nbytes(t) for t in model.graph.initializer)


def inline_bytes(model: onnx.ModelProto) -> int:
    """Bytes of tensor values held in memory (external ones excluded), attributes included."""
    return sum(tensor_nbytes(t) for t in all_tensors(model) if not is_external(t))


def model_bytes(model: onnx.ModelProto) -> Iterator[bytes]:
    """What identifies ``model``'s content, for hashing: its serialised graph, then a digest of each
    data file its external tensors read (a lazy model's bytes alone name its weights, not their
    values). Raises protobuf's error past 2 GB in memory, as ``SerializeToString`` does."""
    yield model.SerializeToString()
    for path in data_files(model):
        try:
            stat = path.stat()
        except OSError:  # not readable from here: its name is all there is to go by
            yield str(path).encode()
            continue
        yield _file_digest(str(path), stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=64)
def _file_digest(path: str, size: int, mtime_ns: int) -> bytes:
    """SHA-256 of a data file, once per (path, size, modification time) in this process."""
    hasher = hashlib.sha256()
    with open(path, "rb") as data:
        for chunk in iter(lambda: data.read(2**24), b""):
            hasher.update(chunk)
    return hasher.digest()


def constant_array(constant: gs.Constant) -> np.ndarray:
    """The values of an onnx-graphsurgeon Constant, reading external data without caching it.

    ``Constant.values`` would load a lazy tensor into the graph for good (so an export would
    carry a copy of it in memory), and cannot find a data file outside the working directory.
    """
    lazy = constant._values
    if isinstance(lazy, LazyValues) and isinstance(lazy.tensor, onnx.TensorProto) \
            and is_external(lazy.tensor):
        return tensor_array(lazy.tensor)
    return np.asarray(constant.values)
