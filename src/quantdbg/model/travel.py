"""How a lazy model travels to a cluster node that cannot see this machine's disk.

A model (or a tensor) whose weights stay in their data file names that file by its folder on this
machine (:mod:`quantdbg.model.external`). Packed for a Ray worker (:mod:`quantdbg.execution.shipping`),
the data files of each such folder travel with it as one :class:`~quantdbg.execution.shipping.Folder`,
put in the object store once, and on arrival the tensors name the node's copy of that folder: ONNX
Runtime then reads the weights from a local path, as on the driver. Only the files the tensors read
travel, and a model whose tensors are all in memory pickles as usual.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import onnx

from quantdbg.execution.shipping import Folder, Packer, local_path, register
from quantdbg.model.external import all_tensors, base_of, is_external, location_of, set_base

_TRAVELLING = "quantdbg:shipped-folder:"
"""The ``basepath`` of a travelling tensor: this prefix and the index of its Folder."""

Message = onnx.ModelProto | onnx.TensorProto


def _external(message: Message) -> list[onnx.TensorProto]:
    tensors = [message] if isinstance(message, onnx.TensorProto) else all_tensors(message)
    return [tensor for tensor in tensors if is_external(tensor)]


def _ship(message: Message, packer: Packer) -> tuple[object, ...] | None:
    """Reduces a message with external tensors to its bytes (bases replaced by Folder indices) and
    the Folders of the data files they read; None (pickled as usual) without external tensors."""
    tensors = _external(message)
    if not tensors:
        return None
    files: dict[str, dict[str, Path]] = {}
    for tensor in tensors:
        base = base_of(tensor)
        files.setdefault(base, {})[location_of(tensor)] = Path(base or ".") / location_of(tensor)
    bases = sorted(files)
    folders = tuple(packer.folder(files[base], Path(base or ".").resolve()) for base in bases)
    index = {base: f"{_TRAVELLING}{i}" for i, base in enumerate(bases)}
    with _based(tensors, index):
        blob = message.SerializeToString()
    return _arrive, (type(message), blob, folders)


@contextlib.contextmanager
def _based(tensors: list[onnx.TensorProto], bases: dict[str, str]) -> Iterator[None]:
    """Gives each tensor the base ``bases`` maps its own to, for the block; then restores its entries.

    The message is serialised with the bases swapped in place rather than copied: a copy of a
    model that also holds tensors in memory would be a second copy of those weights."""
    saved = [[(entry.key, entry.value) for entry in tensor.external_data] for tensor in tensors]
    try:
        for tensor in tensors:
            set_base(tensor, bases[base_of(tensor)])
        yield
    finally:
        for tensor, entries in zip(tensors, saved, strict=True):
            del tensor.external_data[:]
            for key, value in entries:
                entry = tensor.external_data.add()
                entry.key, entry.value = key, value


def _arrive(kind: type[Message], blob: bytes, folders: tuple[Folder, ...]) -> Message:
    """Rebuilds a shipped message whose external tensors read this node's copies of ``folders``."""
    message = kind()
    message.ParseFromString(blob)
    paths = [str(local_path(folder)) for folder in folders]
    for tensor in _external(message):
        base = base_of(tensor)
        if base.startswith(_TRAVELLING):
            set_base(tensor, paths[int(base[len(_TRAVELLING):])])
    return message


register(onnx.ModelProto, _ship)
register(onnx.TensorProto, _ship)

__all__: list[str] = []
