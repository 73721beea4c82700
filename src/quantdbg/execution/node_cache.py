"""A cluster node's copies of the driver's files, in its temporary folder, by content digest.

The first task on a node that needs a folder of files (a model's data file, an evaluation
command's script and data) writes it here from the object store, under a file lock so the node's
other workers wait for it rather than write it again; every later task and map on the node finds
it by its digest. A folder is written beside its final name and renamed into place once complete
and checked, so a killed worker leaves no half-written folder under the final name. Folders unused
for :data:`STALE_SECONDS` go when the next one is written (tasks that read a folder touch it).
"""
from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from quantdbg._fingerprint import file_digest
from quantdbg.errors import BackendError

STALE_SECONDS = 24 * 3600
"""A cached folder not used for this long is removed when the node next writes one."""


def cache_root() -> Path:
    """This node's cache folder (``quantdbg-ray-<uid>`` in the temporary folder), created private."""
    root = Path(tempfile.gettempdir()) / f"quantdbg-ray-{os.getuid()}"
    root.mkdir(mode=0o700, exist_ok=True)
    return root


def materialise(name: str, files: Sequence[tuple[str, str, int]], pieces: Mapping[str, Sequence[Any]],
                get: Callable[[Any], Any]) -> Path:
    """The node's copy of a folder of files, written on first need.

    Args:
        name: The folder's digest (its name in the cache).
        files: ``(path inside the folder, content digest, mode)`` of each file.
        pieces: Content digest -> the object-store references of the file's pieces, in order.
        get: A reference -> its bytes.

    Raises:
        BackendError: A file's pieces are not in ``pieces`` or its content differs from its digest.
    """
    root = cache_root()
    final = root / name
    with _locked(root / f"{name}.lock"):
        if not final.is_dir():
            _remove_stale(root)
            _write(root, final, files, pieces, get)
    touch([final])
    return final


def touch(folders: Iterable[Path]) -> None:
    """Marks cached folders as used now (they stay while tasks read them)."""
    for folder in folders:
        with contextlib.suppress(OSError):
            os.utime(folder)


def _write(root: Path, final: Path, files: Sequence[tuple[str, str, int]],
           pieces: Mapping[str, Sequence[Any]], get: Callable[[Any], Any]) -> None:
    scratch = Path(tempfile.mkdtemp(prefix=f".{final.name}-", dir=root))
    try:
        for relative, content, mode in files:
            target = scratch / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            with open(target, "wb") as out:
                for ref in pieces[content]:
                    out.write(get(ref))
            os.chmod(target, mode)
            if file_digest(target) != content:
                raise BackendError(f"File {relative!r} arrived on this node damaged (its digest differs "
                                   "from the driver's); run the command again.")
        os.rename(scratch, final)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)  # gone already once renamed


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    import fcntl  # POSIX only, as Ray's multi-node clusters are; imported where it is used

    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _remove_stale(root: Path) -> None:
    """Removes cached folders (and leftovers of killed writers) unused for :data:`STALE_SECONDS`."""
    limit = time.time() - STALE_SECONDS
    for entry in root.iterdir():
        with contextlib.suppress(OSError):
            if entry.is_dir() and entry.stat().st_mtime < limit:
                shutil.rmtree(entry)


__all__ = ["STALE_SECONDS", "cache_root", "materialise", "touch"]
