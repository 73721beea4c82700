"""Writing a model atomically, with its weights in a data file beside it when it is large.

A model whose input kept its weights in external data, or whose weights exceed
:attr:`SaveConfig.threshold_bytes`, is written as ``OUT.onnx`` plus ``OUT.onnx.data``: the weights
are streamed one tensor at a time (read from the input's data file when still lazy), so saving
never holds a second copy of them nor a >2 GB protobuf message.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import onnx

from quantdbg._io import atomic_file, same_file, write_bytes_atomic
from quantdbg.errors import ConfigError, ModelError
from quantdbg.model.external import (
    all_tensors,
    data_files,
    external_bases,
    fits_in_protobuf,
    is_external,
    strip_bases,
    tensor_bytes,
    tensor_nbytes,
    weight_bytes,
)

EXTERNAL_THRESHOLD = 1_800_000_000
"""Weights above this many bytes go to a data file: protobuf's 2 GB limit, less room for the graph."""
_ALIGN = 4096
"""Tensors start on a page boundary in the data file, so ONNX Runtime can map them instead of copying."""


@dataclass(frozen=True)
class SaveConfig:
    """How :func:`save_model` writes a model.

    Attributes:
        external_data: True: weights always go to a data file; False: never (a model past 2 GB
            then cannot be saved); None: when the model still reads weights from a data file
            (its input used external data) or its weights exceed ``threshold_bytes``.
        threshold_bytes: The weight size above which ``external_data=None`` writes a data file.
        location: The data file's name, in the model's folder; None: ``<model file name>.data``.
        size_threshold: Tensors smaller than this many bytes stay in the graph file.
    """

    external_data: bool | None = None
    threshold_bytes: int = EXTERNAL_THRESHOLD
    location: str | None = None
    size_threshold: int = 1024

    def __post_init__(self) -> None:
        for name in ("threshold_bytes", "size_threshold"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ConfigError(f"SaveConfig.{name} must be a non-negative int, got {value!r}.")
        if self.location is not None:
            check_location(self.location)


def check_location(location: str) -> str:
    """Refuses a data file name that would leave the model's folder (the loader's rule on reading).

    Raises:
        ConfigError: ``location`` is empty, absolute, or holds a folder separator or ``..``.
    """
    if not location or location in (".", "..") or Path(location).name != location or "\\" in location:
        raise ConfigError(f"External data location {location!r} must be a plain file name in the model's "
                          "folder (no folder separators, not absolute), e.g. 'model.onnx.data'.")
    return location


def save_model(model: onnx.ModelProto, path: str | os.PathLike, config: SaveConfig | None = None) -> Path:
    """Writes ``model`` atomically: to temporary files in the same folder, then renamed.

    With external data the data file is renamed into place first, then the graph that points at
    it, so a reader never finds the new graph without its weights.

    Args:
        model: The model to write (not modified).
        path: Destination ``.onnx`` path; its folder must exist.
        config: When and where weights go to a data file (default :class:`SaveConfig`).

    Returns:
        The destination path.

    Raises:
        ModelError: The destination folder does not exist, or the model exceeds 2 GB and
            ``config.external_data`` is False.
        ConfigError: ``config.location`` is not a plain file name, or names the model file itself,
            or the model file or its data file is a data file ``model`` still reads its weights from.
    """
    config = config if config is not None else SaveConfig()
    dest = Path(path)
    if not dest.parent.is_dir():
        raise ModelError(f"Cannot write {str(dest)!r}: folder {str(dest.parent)!r} does not exist.")
    _refuse_read_files(model, dest)
    if not _wants_external(model, config):
        with atomic_file(dest, ModelError) as tmp:
            tmp.write_bytes(model.SerializeToString())
        return dest
    data = data_path(dest, config)
    if data.name == dest.name:
        raise ConfigError(f"External data location {data.name!r} is the model file itself; pick another "
                          "name.")
    _refuse_read_files(model, data, dest)
    write_external(model, dest, data.name, config.size_threshold)
    return dest


def data_path(path: str | os.PathLike, config: SaveConfig | None = None) -> Path:
    """Where :func:`save_model` puts the weights of a model saved at ``path`` when it writes a data
    file: ``config.location`` beside it, by default ``<model file name>.data``.

    Raises:
        ConfigError: ``config.location`` is not a plain file name.
    """
    dest = Path(path)
    location = config.location if config is not None and config.location is not None else dest.name + ".data"
    return dest.parent / check_location(location)


def _refuse_read_files(model: onnx.ModelProto, target: Path, model_path: Path | None = None) -> None:
    """Refuses to write ``target`` when ``model`` still reads weights from it (kept in their data
    file since loading): replacing it would change the weights of this model and of the file it came
    from."""
    for read in data_files(model):
        if same_file(target, read):
            what = f"{str(model_path)!r} would write its weights to {str(target)!r}, which" if model_path \
                else f"{str(target)!r}"
            raise ConfigError(f"Cannot save the model: {what} is the data file it still reads its weights "
                              "from; save it under another name.")


def _wants_external(model: onnx.ModelProto, config: SaveConfig) -> bool:
    if config.external_data is False:
        if not fits_in_protobuf(model):
            raise ModelError("The model exceeds protobuf's 2 GB limit and cannot be saved as one file; "
                             "save it with SaveConfig(external_data=None or True).")
        return False
    if config.external_data:
        return True
    return bool(external_bases(model)) or weight_bytes(model) > config.threshold_bytes \
        or not fits_in_protobuf(model)


def write_external(model: onnx.ModelProto, dest: Path, location: str, size_threshold: int = 1024,
                   copy_external: bool = True) -> Path:
    """Writes ``model`` as ``dest`` plus the data file ``location`` beside it, one tensor at a time.

    Initializers of at least ``size_threshold`` bytes, and (``copy_external``) those the model
    still reads from a data file, go to the new data file; without ``copy_external`` the latter keep
    their reference, for a caller that places their data file beside ``dest`` itself. Attribute
    tensors stay in the graph. ``model`` is not modified.
    """
    shell = _shell(model)
    with atomic_file(dest.parent / location, ModelError) as tmp, open(tmp, "wb") as data:
        for init in model.graph.initializer:
            if is_external(init) and not copy_external:
                shell.graph.initializer.append(_reference(init))
            else:
                shell.graph.initializer.append(_stored(init, data, location, size_threshold))
        graph = shell.SerializeToString()  # may fail; the data file is published only after it
    return write_bytes_atomic(dest, graph)


def _shell(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` without its initializers (copying them would double their memory)."""
    out = onnx.ModelProto()
    for field, value in model.ListFields():
        if field.name != "graph":
            _copy_field(out, field.name, value)
    for field, value in model.graph.ListFields():
        if field.name != "initializer":
            _copy_field(out.graph, field.name, value)
    for tensor in all_tensors(out):  # attribute tensors kept in a data file come into the graph
        if is_external(tensor):
            tensor.raw_data = tensor_bytes(tensor)
            tensor.data_location = onnx.TensorProto.DEFAULT
            del tensor.external_data[:]
    return out


def _copy_field(target: object, name: str, value: object) -> None:
    if hasattr(value, "extend"):  # a repeated field
        getattr(target, name).extend(value)
    elif hasattr(value, "CopyFrom"):  # a message
        getattr(target, name).CopyFrom(value)
    else:
        setattr(target, name, value)


def _reference(init: onnx.TensorProto) -> onnx.TensorProto:
    out = onnx.TensorProto()
    out.CopyFrom(init)
    strip_bases(out)
    return out


def _stored(init: onnx.TensorProto, data: BinaryIO, location: str, size_threshold: int) -> onnx.TensorProto:
    out = onnx.TensorProto()
    if init.data_type == onnx.TensorProto.STRING or \
            (not is_external(init) and tensor_nbytes(init) < size_threshold):
        out.CopyFrom(init)
        return out
    payload = tensor_bytes(init)
    offset = -data.tell() % _ALIGN + data.tell()
    data.write(b"\0" * (offset - data.tell()))
    data.write(payload)
    out.name, out.data_type, out.doc_string = init.name, init.data_type, init.doc_string
    out.dims.extend(init.dims)
    out.data_location = onnx.TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", str(offset)), ("length", str(len(payload)))):
        entry = out.external_data.add()
        entry.key, entry.value = key, value
    return out
