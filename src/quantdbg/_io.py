"""Atomic file writes: a reader never sees a half-written file, nothing is written unless the
caller named a path, a write that fails (a full disk, a folder made read-only) is one
:class:`~quantdbg.errors.OutputError` naming the file, and two runs never write one file at once."""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from quantdbg.errors import ConfigError, OutputError, QuantDbgError


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
        OutputError: Creating, writing or renaming the file failed (an OSError inside the block
            too); ``path`` is unchanged.
    """
    dest = Path(path)
    if not dest.parent.is_dir():
        raise error(f"Cannot write {str(dest)!r}: folder {str(dest.parent)!r} does not exist.")
    tmp = ""
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent)
        os.close(fd)
        yield Path(tmp)
        publish(tmp, dest)
    except OutputError:
        raise
    except OSError as err:
        raise output_error([dest], err) from err
    finally:
        if tmp and os.path.exists(tmp):
            os.unlink(tmp)


def output_error(paths: Iterable[str | os.PathLike], err: OSError) -> OutputError:
    """The one-line error for ``err`` raised while writing ``paths``: ``Cannot write 'a', 'b': No space
    left on device; nothing was written.`` Its ``errno`` and ``strerror`` are those of ``err``."""
    reason = err.strerror or str(err)
    found = OutputError(f"Cannot write {', '.join(repr(str(p)) for p in paths)}: {reason}; nothing was "
                        "written.")
    found.errno, found.strerror = err.errno, reason
    return found


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
    before the first rename, and a rename that fails puts back what the earlier ones replaced, so a
    failure (a full disk, a folder made read-only, an exception) leaves no destination changed:
    never a model without its plan, a Markdown report without its HTML.

    Args:
        paths: Name -> destination; None entries are left out (nothing to write).

    Yields:
        Name -> stand-in path, for the destinations given.

    Raises:
        ConfigError: A destination folder does not exist, or two names share a destination.
        OutputError: Writing or moving a file failed; no destination changed.
    """
    given = {name: Path(path) for name, path in paths.items() if path is not None}
    _refuse_shared(given)
    stages: list[Path] = []
    try:
        targets: dict[str, Path] = {}
        for dest in given.values():
            if not dest.parent.is_dir():
                raise ConfigError(f"Cannot write {str(dest)!r}: folder {str(dest.parent)!r} does not exist.")
        try:
            for name, dest in given.items():
                stages.append(Path(tempfile.mkdtemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent)))
                targets[name] = stages[-1] / dest.name
            yield targets
            _move_all(stages)
        except OSError as err:  # a full disk, a folder made read-only meanwhile: one line, not a traceback
            raise output_error(given.values(), err) from err
    finally:
        for stage in stages:
            shutil.rmtree(stage, ignore_errors=True)


def _refuse_shared(given: Mapping[str, Path]) -> None:
    seen: dict[Path, str] = {}
    for name, dest in given.items():
        key = dest.resolve()
        if key in seen:
            raise ConfigError(f"{name} and {seen[key]} are both {str(dest)!r}; give each output its own "
                              "path.")
        seen[key] = name


def _move_all(stages: list[Path]) -> None:
    """Renames every file of every stage folder into the folder around it; when a rename fails, the
    files moved so far are taken back and those they replaced restored (kept as hard links)."""
    moved: list[tuple[Path, Path, bool, Path | None]] = []  # (destination, staged, existed, old file)
    try:
        for stage in stages:
            # data files before the graph that points at them, so a reader never finds one without the other
            for item in sorted(stage.iterdir(), key=lambda p: (p.suffix != ".data", p.name)):
                dest = stage.parent / item.name
                existed = os.path.lexists(dest)
                old = _hard_link(dest, stage / f".{item.name}.old") if existed else None
                os.replace(item, dest)
                moved.append((dest, item, existed, old))
    except OSError:
        for dest, item, existed, old in reversed(moved):
            if existed and old is None:
                continue  # the replaced file could not be kept: the new one stays rather than nothing
            with contextlib.suppress(OSError):
                os.replace(dest, item)
                if old is not None:
                    os.replace(old, dest)
        raise


def _hard_link(src: Path, link: Path) -> Path | None:
    try:
        os.link(src, link)
    except OSError:  # a file system without hard links
        return None
    return link


def same_file(a: str | os.PathLike, b: str | os.PathLike) -> bool:
    """True when ``a`` and ``b`` name one file: the same existing file (through a symlink or a hard
    link too), or, when one does not exist yet, the same resolved path."""
    try:
        return os.path.samefile(a, b)
    except OSError:  # one of them does not exist (yet)
        return Path(a).resolve() == Path(b).resolve()


@contextlib.contextmanager
def output_lock(dest: str | os.PathLike, what: str) -> Iterator[Path]:
    """Holds an advisory lock (``fcntl.flock``) on ``.NAME.lock`` beside ``dest`` while the block runs,
    so a second run that would write ``dest`` meanwhile is refused instead of mixing its files in.

    The lock file holds this process's id, for the refusal; the kernel releases the lock when the
    process ends, however it ends (SIGKILL too), and the file is removed when the block ends.

    Args:
        dest: The output the lock guards (resolved, so every spelling of it takes one lock).
        what: How the refusal names the output, e.g. ``"--plan 'p.json'"``.

    Yields:
        The lock file.

    Raises:
        ConfigError: Another process holds the lock (the message names it and that process).
        OutputError: The lock file cannot be created.
    """
    target = Path(os.path.realpath(dest))
    lock = target.parent / f".{target.name}.lock"
    fd = _acquire(lock, what)
    try:
        try:
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode())
        except OSError as err:
            raise output_error([lock], err) from err
        yield lock
    finally:
        with contextlib.suppress(OSError):
            os.unlink(lock)  # while still held: a run that opened it meanwhile finds it gone, and retries
        os.close(fd)


def _acquire(lock: Path, what: str) -> int:
    """An open descriptor of ``lock`` holding its exclusive lock; the file at ``lock`` is that file
    (a holder that removed it between our open and our lock would have us lock a stale file)."""
    while True:
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as err:
            raise output_error([lock], err) from err
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "unknown"
            os.close(fd)
            raise ConfigError(f"{what} is being written by another quantdbg run (pid {pid}, lock file "
                              f"{str(lock)!r}); wait for it to end, or choose another output path.") from None
        try:
            if os.path.samestat(os.fstat(fd), os.stat(lock)):
                return fd
        except FileNotFoundError:
            pass
        os.close(fd)
