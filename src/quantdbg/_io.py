"""Atomic file writes: a reader never sees a half-written file, and nothing is written unless
the caller named a path."""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from quantdbg.errors import ConfigError, QuantDbgError


@contextlib.contextmanager
def atomic_file(path: str | os.PathLike, error: type[QuantDbgError] = ConfigError) -> Iterator[Path]:
    """Yields a temporary path beside ``path`` to write; on success it is renamed over ``path``.

    A failure inside the ``with`` block removes the temporary file and leaves ``path`` as it was.

    Args:
        path: The destination; its folder must exist.
        error: The error type for a missing folder (e.g. ModelError when writing a model).

    Yields:
        The temporary file's path (an empty file).

    Raises:
        QuantDbgError: ``error``, when the destination folder does not exist.
    """
    dest = Path(path)
    if not dest.parent.is_dir():
        raise error(f"Cannot write {str(dest)!r}: folder {str(dest.parent)!r} does not exist.")
    fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        publish(tmp, dest)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def write_bytes_atomic(path: str | os.PathLike, data: bytes) -> Path:
    """Writes ``data`` to a temporary file beside ``path``, then renames it over ``path``.

    Raises:
        ConfigError: The destination folder does not exist.
    """
    with atomic_file(path) as tmp:
        tmp.write_bytes(data)
    return Path(path)


def publish(tmp: str | os.PathLike, dest: str | os.PathLike) -> None:
    """Gives a finished temporary file the usual permissions and renames it over ``dest``.

    mkstemp creates files readable by their owner only; a report or model is meant to be
    shared like any file the user writes, so it gets ``0o666`` less the umask.
    """
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)
    os.replace(tmp, dest)


def write_text_atomic(path: str | os.PathLike, text: str) -> Path:
    """Writes UTF-8 ``text`` atomically (see :func:`write_bytes_atomic`)."""
    return write_bytes_atomic(path, text.encode("utf-8"))


def write_json_atomic(path: str | os.PathLike, obj: Any) -> Path:
    """Writes ``obj`` as indented, key-sorted JSON atomically."""
    return write_text_atomic(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")


@contextlib.contextmanager
def commit_together(paths: Mapping[str, str | os.PathLike | None]) -> Iterator[dict[str, Path]]:
    """Yields a stand-in path for each destination; once the block succeeds all are moved into place.

    Each stand-in has its destination's file name, inside a private folder beside the destination,
    so whatever a writer puts next to it (external weight data) moves along. Every file is finished
    before the first rename, so a failure while writing (a full disk, an exception) leaves no
    destination changed: never a model without its plan or cache.

    Args:
        paths: Name -> destination; None entries are left out (nothing to write).

    Yields:
        Name -> stand-in path, for the destinations given.

    Raises:
        ConfigError: A destination folder does not exist, or writing failed (nothing was moved
            into place when the failure came while writing).
    """
    given = {name: Path(path) for name, path in paths.items() if path is not None}
    stages: list[Path] = []
    try:
        targets: dict[str, Path] = {}
        for name, dest in given.items():
            if not dest.parent.is_dir():
                raise ConfigError(f"Cannot write {str(dest)!r}: folder {str(dest.parent)!r} does not exist.")
            stages.append(Path(tempfile.mkdtemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent)))
            targets[name] = stages[-1] / dest.name
        try:
            yield targets
            for stage in stages:
                for item in sorted(stage.iterdir()):
                    os.replace(item, stage.parent / item.name)
        except OSError as err:  # a full disk, a folder made read-only meanwhile: one line, not a traceback
            raise ConfigError(f"Cannot write {', '.join(repr(str(p)) for p in given.values())}: "
                              f"{err.strerror or err}; nothing was written.") from err
    finally:
        for stage in stages:
            shutil.rmtree(stage, ignore_errors=True)
