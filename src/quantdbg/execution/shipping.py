"""Sending objects to cluster nodes that cannot see this machine's disk, with the files they read.

A task's ``shared`` object reaches a Ray worker through the object store, but some of what it holds
names files on the driver's disk: the data file of a model whose weights stay on disk, the script
and data of an evaluation command. :func:`pack` pickles ``shared`` with each such set of files
turned into a :class:`Folder`: the files themselves go into the object store in pieces, once per
executor whatever the number of maps and tasks; :func:`unpack`, on a worker, rebuilds the object,
and the first task on a node that needs a folder writes it into the node's temporary folder
(:mod:`quantdbg.execution.node_cache`), where later tasks and maps find it by its digest. Files,
not buffers, because ONNX Runtime reads external weights (and a command its script) from a path.

Which objects hold files is said by the packages that own them, through :func:`register` (as
:mod:`copyreg` does for pickling), so this module knows neither ONNX nor metrics.
"""
from __future__ import annotations

import contextlib
import contextvars
import functools
import io
import os
import pickle
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np

from quantdbg import _optional
from quantdbg._fingerprint import digest, file_digest
from quantdbg.errors import BackendError, ConfigError
from quantdbg.execution import node_cache

cloudpickle = _optional.lazy_import("ray.cloudpickle", "ray")

PIECE_BYTES = 64 * 2**20
"""Bytes per object-store piece of a file: what the driver holds in memory at once while putting it."""

Put = Callable[[np.ndarray], Any]
"""Stores a copy of a byte array in the object store and returns its reference."""
Get = Callable[[Any], Any]
"""A reference -> the bytes it holds (any object with the buffer protocol)."""


@dataclass(frozen=True)
class ShippedFile:
    """One file of a :class:`Folder`: its path inside the folder, content digest, size and mode."""

    name: str
    digest: str
    size: int
    mode: int


@dataclass(frozen=True)
class Folder:
    """Files of one folder of the driver's machine that travel together.

    Attributes:
        files: The files, by their path inside the folder.
        origin: The folder on the driver's machine: what workers on the driver's own node use.
        node: The driver's node (None: unknown).
        shipped: False when the files were not put in the object store (every worker of the
            cluster ran on the driver's node when the object was packed).
    """

    files: tuple[ShippedFile, ...]
    origin: str
    node: str | None = None
    shipped: bool = True

    @functools.cached_property
    def digest(self) -> str:
        """The folder's identity on a node: the digest of its files' names, contents and modes."""
        return digest(*(f"{f.name}|{f.digest}|{f.mode:o}" for f in self.files))

    @property
    def nbytes(self) -> int:
        """The files' total size."""
        return sum(f.size for f in self.files)


@dataclass(frozen=True)
class Parcel:
    """A packed object: what one ``ray.put`` sends.

    Attributes:
        payload: The pickle stream.
        buffers: Its out-of-band buffers (NumPy arrays' data), which a worker reads in place.
        pieces: File digest -> references of the file's pieces, in order.
        folders: The folders the object reads, with their files.
    """

    payload: bytes
    buffers: tuple[np.ndarray, ...]
    pieces: Mapping[str, tuple[Any, ...]] = field(default_factory=dict)
    folders: tuple[Folder, ...] = ()

    @property
    def nbytes(self) -> int:
        """Bytes of the object itself (the payload and its buffers), the files aside."""
        return len(self.payload) + sum(buffer.nbytes for buffer in self.buffers)


Reducer = Callable[[Any, "Packer"], "tuple[Any, ...] | None"]
"""``reducer(obj, packer)``: a pickle reduce tuple for ``obj`` (its arguments may hold
:class:`Folder` s from ``packer.folder``), or None to pickle ``obj`` as usual."""

_REDUCERS: dict[type, Reducer] = {}


def register(cls: type, reducer: Reducer) -> None:
    """Says how instances of ``cls`` (that class exactly) travel when packed by :func:`pack`."""
    _REDUCERS[cls] = reducer


class Packer:
    """Makes :class:`Folder` s of the files an object reads while it is packed.

    Args:
        put: Stores a piece in the object store; None keeps every file where it is (all workers
            run on the driver's node and read the files in place).
        node: The driver's node.
        known: Files put earlier, ``(path, size, mtime) -> (digest, pieces)``; updated. An executor
            keeps one, so each file is read, hashed and put once whatever the number of maps.
    """

    def __init__(self, put: Put | None, node: str | None,
                 known: dict[tuple[str, int, int], tuple[str, tuple[Any, ...]]]) -> None:
        self.put = put
        self.node = node
        self.known = known
        self.pieces: dict[str, tuple[Any, ...]] = {}
        self.folders: dict[str, Folder] = {}
        self.new_bytes = 0

    def folder(self, files: Mapping[str, str | os.PathLike], origin: str | os.PathLike) -> Folder:
        """A Folder of ``files`` (path inside the folder -> the file on this machine).

        Raises:
            ConfigError: A name is absolute or climbs out of the folder.
            OSError: A file cannot be read.
        """
        shipped = tuple(self._file(name, Path(path)) for name, path in sorted(files.items()))
        folder = Folder(shipped, str(origin), self.node, self.put is not None)
        self.folders.setdefault(folder.digest, folder)
        return folder

    def _file(self, name: str, path: Path) -> ShippedFile:
        parts = PurePosixPath(name).parts
        if not parts or PurePosixPath(name).is_absolute() or ".." in parts:
            raise ConfigError(f"File {name!r} cannot travel to a cluster node: name it by a path inside "
                              "its folder.")
        stat = path.stat()
        mode = stat.st_mode & 0o777
        if self.put is None:
            return ShippedFile(name, "", stat.st_size, mode)
        key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns)
        if key not in self.known:
            self.known[key] = (file_digest(path), self._put_pieces(path))
        found, pieces = self.known[key]
        self.pieces[found] = pieces
        return ShippedFile(name, found, stat.st_size, mode)

    def _put_pieces(self, path: Path) -> tuple[Any, ...]:
        assert self.put is not None
        refs = []
        with open(path, "rb") as source:
            while piece := source.read(PIECE_BYTES):
                refs.append(self.put(np.frombuffer(piece, dtype=np.uint8)))
                self.new_bytes += len(piece)
        return tuple(refs)


@functools.cache
def _pickler() -> type:
    """Ray's cloudpickle (functions of ``__main__`` by value, as Ray sends them), plus the reducers."""

    class ShippingPickler(cloudpickle.CloudPickler):  # type: ignore[name-defined,misc]
        def __init__(self, file: io.BytesIO, packer: Packer, buffers: list[pickle.PickleBuffer]) -> None:
            super().__init__(file, protocol=5, buffer_callback=buffers.append)
            self.packer = packer

        def reducer_override(self, obj: Any) -> Any:
            reducer = _REDUCERS.get(type(obj))
            reduced = reducer(obj, self.packer) if reducer is not None else None
            return reduced if reduced is not None else super().reducer_override(obj)

    return ShippingPickler


def pack(shared: Any, packer: Packer) -> Parcel:
    """Pickles ``shared`` into a :class:`Parcel`, the files it reads put in the object store by ``packer``.

    Raises:
        ConfigError: What a registered reducer refuses (e.g. a file that cannot travel).
    """
    stream = io.BytesIO()
    buffers: list[pickle.PickleBuffer] = []
    _pickler()(stream, packer, buffers).dump(shared)
    arrays = tuple(np.frombuffer(buffer.raw(), dtype=np.uint8) for buffer in buffers)
    return Parcel(stream.getvalue(), arrays, dict(packer.pieces), tuple(packer.folders.values()))


@dataclass
class _Arrival:
    pieces: Mapping[str, tuple[Any, ...]]
    get: Get
    node: str | None
    used: list[Path] = field(default_factory=list)


_ARRIVAL: contextvars.ContextVar[_Arrival] = contextvars.ContextVar("quantdbg_arrival")


def unpack(parcel: Parcel, get: Get, node: str | None) -> tuple[Any, tuple[Path, ...]]:
    """Rebuilds a packed object on a worker of ``node``.

    Returns:
        The object, and the node's folders it reads (to keep them fresh in the node's cache).
    """
    arrival = _Arrival(parcel.pieces, get, node)
    with _arriving(arrival):
        value = pickle.loads(parcel.payload, buffers=parcel.buffers)
    return value, tuple(arrival.used)


@contextlib.contextmanager
def _arriving(arrival: _Arrival) -> Iterator[None]:
    token = _ARRIVAL.set(arrival)
    try:
        yield
    finally:
        _ARRIVAL.reset(token)


def local_path(folder: Folder) -> Path:
    """Where ``folder`` is on this node: its origin on the driver's node, else the node's copy,
    written by the first task that needs it. For reducers' rebuild functions, run by :func:`unpack`.

    Raises:
        BackendError: The files were not shipped (the node joined after the object was packed),
            or a file arrived damaged.
    """
    arrival = _ARRIVAL.get()
    if folder.node is not None and folder.node == arrival.node:
        return Path(folder.origin)
    if not folder.shipped:
        raise BackendError(f"The files of {folder.origin!r} were not sent to this node: it joined the "
                           "cluster after the work started; run the command again.")
    files = [(f.name, f.digest, f.mode) for f in folder.files]
    path = node_cache.materialise(folder.digest, files, arrival.pieces, arrival.get)
    arrival.used.append(path)
    return path


__all__ = ["PIECE_BYTES", "Folder", "Packer", "Parcel", "ShippedFile", "local_path", "pack", "register",
           "unpack"]
