"""The one journal of every run that resumes (``analyze``, ``fallback``, ``auto``): what was computed,
appended as it is done.

A journal is a text file of JSON lines. The first line is the header: the format, the kind of run
and its ingredients -- one digest per thing that decides the result (the model, the data, the
metric, the contents of the files an evaluation command reads, the target, the settings). Every
further line is one entry ``{"key": ..., "value": ..., "chain": ...}``: a value computed once (an
evaluation, a calibration, a report) under a key naming exactly what was computed. Each entry's
``chain`` is the digest of the previous entry's chain (the header's for the first) and of the entry
itself, so a journal changed by hand is refused instead of trusted.

Entries are appended and synced one at a time; nothing is ever rewritten. A run killed at any
point leaves at most a torn last line, which the next run drops with a warning (and cuts off before
it appends). A journal of another run (an ingredient differs) or of an older quantdbg is refused in
one line that says what differs and offers ``--restart``.
"""
from __future__ import annotations

import json
import logging
import os
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from quantdbg import _json
from quantdbg._fingerprint import differences, digest
from quantdbg.errors import ConfigError, FormatError, QuantDbgError, QuantDbgWarning

logger = logging.getLogger(__name__)

T = TypeVar("T")

FORMAT = "quantdbg.journal/1"
"""The format tag of the header line."""

EVALUATION = "evaluation:"
"""Keys of task-metric evaluations start with this (a run that made none leaves no journal when it
fails)."""

_OLD_FORMATS = ("quantdbg.auto-progress/1", "quantdbg.sensitivity-progress/1", "quantdbg.sensitivity/1")
_RESTART = "pass --restart to start over (or delete the file)"


def canonical(value: Any) -> str:
    """The one text of JSON-ready ``value`` its chain digest is taken over (sorted keys, no spaces)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False)


class Journal:
    """The entries of one run, kept in memory and (with a path) appended to the journal file.

    Args:
        path: The journal file (None: kept in memory only).
        kind: The kind of run (``"auto"``, ``"fallback"``, ``"analyze"``); a journal of another
            kind is refused.
        ingredients: Ingredient name -> digest of everything that decides the run's result.

    Attributes:
        entries: Key -> JSON-ready value, the last one recorded under each key (without a file, the
            values :meth:`stored` computed are kept as they are, not here).
        phase: What the evaluations made now are counted under (the flow's phase).
        used: Evaluation key -> the phase that made it, for every evaluation this run used
            (those read from the file included).
    """

    def __init__(self, path: str | os.PathLike | None, kind: str, ingredients: Mapping[str, str]) -> None:
        self.path = None if path is None else Path(path)
        self.kind = kind
        self.ingredients = dict(ingredients)
        self.entries: dict[str, Any] = {}
        self.phase = ""
        self.used: dict[str, str] = {}
        self._chain = _header_chain(kind, self.ingredients)
        self._size: int | None = None  # bytes of the file that hold whole entries (None: no file yet)
        self._created = False
        self._values: dict[str, Any] = {}  # without a file: what stored() computed, as it is

    @classmethod
    def open(cls, path: str | os.PathLike | None, kind: str, ingredients: Mapping[str, str]) -> Journal:
        """The journal of a run, with the entries an earlier run of the same job left in ``path``.

        Raises:
            ConfigError: The file belongs to another run (the message names what differs), was
                written by an older quantdbg, or was changed after it was written.
            FormatError: The file is not a journal.
        """
        journal = cls(path, kind, ingredients)
        if journal.path is None or not journal.path.exists():
            return journal
        found = _read(journal.path)
        if found.header is None:
            journal._size = 0  # an empty file: a run killed as it created it
            return journal
        if found.header.get("kind") != kind:
            raise ConfigError(f"Resume file {str(journal.path)!r} belongs to a `quantdbg "
                              f"{found.header.get('kind')}` run, not `quantdbg {kind}`; choose another "
                              f"resume file, or {_RESTART}.")
        if found.ingredients != journal.ingredients:
            raise ConfigError(f"Resume file {str(journal.path)!r} belongs to another run: "
                              f"{differences(found.ingredients, journal.ingredients)}; {_RESTART}.")
        journal.entries, journal._chain, journal._size = found.entries, found.chain, found.size
        evaluations = sum(key.startswith(EVALUATION) for key in found.entries)
        logger.info("resuming from %s: %d evaluation(s) and %d other result(s) already done", journal.path,
                    evaluations, len(found.entries) - evaluations)
        return journal

    @classmethod
    def read(cls, path: str | os.PathLike) -> Journal:
        """A journal file as it is, whatever run wrote it (its chain checked), e.g. to look at it.

        Raises:
            ConfigError: The file was written by an older quantdbg or changed after it was written.
            FormatError: The file is missing or not a journal.
        """
        found = _read(Path(path))
        header = found.header or {}
        journal = cls(None, str(header.get("kind", "")), found.ingredients)
        journal.entries = found.entries
        return journal

    def __reduce__(self) -> tuple[Any, ...]:
        """Travels to a worker process as an in-memory copy: only the run's own process appends."""
        copy = (None, self.kind, self.ingredients)
        return _in_memory, (copy, self.entries, self.phase, self._values)

    def get(self, key: str) -> Any:
        """The value recorded under ``key`` (None when there is none)."""
        return self.entries.get(key)

    def __contains__(self, key: object) -> bool:
        return key in self.entries or key in self._values

    def record(self, key: str, value: Any) -> None:
        """Appends ``key`` -> JSON-ready ``value`` (a later entry of a key replaces the earlier one).

        Raises:
            ConfigError: The file cannot be written (a full disk, a folder made read-only).
        """
        text = canonical(value)
        chain = digest(self._chain, key, text)
        line = canonical({"chain": chain, "key": key, "value": value}) + "\n"
        if self.path is not None:
            self._append(line.encode("utf-8"))
        self.entries[key] = value
        self._chain = chain

    def stored(self, key: str, compute: Callable[[], T], encode: Callable[[T], Any],
               decode: Callable[[Any, str], T]) -> T:
        """The value recorded under ``key``, else ``compute()`` recorded there.

        Args:
            key: What the value is.
            compute: Makes it.
            encode: The value -> JSON-ready data.
            decode: JSON-ready data and where it comes from (for messages) -> the value.
        """
        if key in self._values:
            return self._values[key]  # type: ignore[no-any-return]
        if key in self.entries:
            return decode(self.entries[key], f"{self.where} entry {key!r}")
        value = compute()
        if self.path is None:
            self._values[key] = value  # nothing is written: its JSON form would only cost time
        else:
            self.record(key, encode(value))
        return value

    @property
    def where(self) -> str:
        """The file, for messages."""
        return repr(str(self.path)) if self.path is not None else "the journal"

    def holds_evaluations(self) -> bool:
        """Whether any task-metric evaluation is recorded."""
        return any(key.startswith(EVALUATION) for key in self.entries)

    def __enter__(self) -> Journal:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: Any) -> None:
        """A run that stopped on bad input removes a journal not worth resuming: one holding no
        evaluation, or one this run created when the settings must change (a ConfigError). A
        signal or a crash keeps it."""
        if not isinstance(error, QuantDbgError) or self.path is None or self._size is None:
            return
        if not self.holds_evaluations() or (self._created and isinstance(error, ConfigError)):
            self.path.unlink(missing_ok=True)
            self._size = None

    def _append(self, data: bytes) -> None:
        assert self.path is not None
        new = self._size is None
        if self._size in (None, 0):
            header = {"format": FORMAT, "ingredients": self.ingredients, "kind": self.kind}
            data = (canonical(header) + "\n").encode("utf-8") + data
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o666)
            try:
                os.ftruncate(fd, self._size or 0)  # drops a torn last line before appending
                os.lseek(fd, self._size or 0, os.SEEK_SET)
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
                os.fsync(fd)
            finally:
                os.close(fd)
            if new:
                _sync_folder(self.path.parent)
        except OSError as err:
            raise ConfigError(f"Cannot write the resume file {str(self.path)!r}: {err.strerror or err}; free "
                              "space or choose another resume file.") from err
        self._created = self._created or new
        self._size = (self._size or 0) + len(data)


def _in_memory(args: tuple[Any, ...], entries: dict[str, Any], phase: str, values: dict[str, Any]) -> Journal:
    journal = Journal(*args)
    journal.entries, journal.phase, journal._values = dict(entries), phase, dict(values)
    return journal


def _header_chain(kind: str, ingredients: Mapping[str, str]) -> str:
    return digest(FORMAT, kind, canonical(dict(ingredients)))


def _sync_folder(folder: Path) -> None:
    """Syncs a folder so a file just created in it survives a crash of the machine (not on Windows)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


class _Found:
    """What a journal file holds: its header, ingredients, entries, last chain and whole-entry size."""

    def __init__(self) -> None:
        self.header: dict[str, Any] | None = None
        self.ingredients: dict[str, str] = {}
        self.entries: dict[str, Any] = {}
        self.chain = ""
        self.size = 0


def _read(path: Path) -> _Found:
    """Reads and checks a journal file (a torn last line is dropped with a warning).

    Raises:
        ConfigError: An older quantdbg wrote it, or it was changed after it was written.
        FormatError: It cannot be read or is not a journal.
    """
    try:
        raw = path.read_bytes()
    except OSError as err:
        raise FormatError(f"Cannot read the resume file {str(path)!r}: {err.strerror or err}.") from err
    found = _Found()
    lines = raw.split(b"\n")
    torn = lines.pop()  # after the last newline: empty unless a write was cut short
    if not lines:
        if torn and not _is_torn_header(torn):
            _not_a_journal(path, raw)
        return found
    found.header = _header(path, lines[0], raw)
    found.ingredients = found.header["ingredients"]
    found.chain = _header_chain(found.header["kind"], found.ingredients)
    found.size = len(lines[0]) + 1
    for number, line in enumerate(lines[1:], start=2):
        key, value, found.chain = _entry(path, line, number, found.chain)
        found.entries[key] = value
        found.size += len(line) + 1
    if torn:
        warnings.warn(f"Resume file {str(path)!r}: its last line was cut short (the run that wrote it was "
                      "killed while writing); it is dropped and that result made again.", QuantDbgWarning,
                      stacklevel=4)
    return found


def _is_torn_header(data: bytes) -> bool:
    start = canonical({"format": FORMAT})[:-1].encode()
    return start.startswith(data) or data.startswith(start)


def _header(path: Path, line: bytes, raw: bytes) -> dict[str, Any]:
    try:
        header = _json.parse(line, repr(str(path)))
    except FormatError:
        header = None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        _not_a_journal(path, raw)
    ingredients, kind = header.get("ingredients"), header.get("kind")
    if not (isinstance(kind, str) and isinstance(ingredients, dict)
            and all(isinstance(v, str) for v in ingredients.values())):
        raise _changed(path, 1)
    return header  # type: ignore[no-any-return]


def _entry(path: Path, line: bytes, number: int, previous: str) -> tuple[str, Any, str]:
    try:
        entry = _json.parse(line, repr(str(path)))
    except FormatError:
        raise _changed(path, number) from None
    if not isinstance(entry, dict) or set(entry) != {"chain", "key", "value"} \
            or not isinstance(entry["key"], str):
        raise _changed(path, number)
    try:
        chain = digest(previous, entry["key"], canonical(entry["value"]))
    except (ValueError, RecursionError):  # a non-finite float (quantdbg writes strings), or too deep
        raise _changed(path, number) from None
    if entry["chain"] != chain:
        raise _changed(path, number)
    return entry["key"], entry["value"], chain


def _changed(path: Path, line: int) -> ConfigError:
    return ConfigError(f"Resume file {str(path)!r} was changed after quantdbg wrote it (line {line} does not "
                       f"match its checksum), so its results cannot be trusted; {_RESTART}.")


def _not_a_journal(path: Path, raw: bytes) -> None:
    """Raises the error for a file that is no journal: an older quantdbg's progress file, or another."""
    try:
        document = _json.parse(raw, repr(str(path)))
    except FormatError:
        document = None
    found = document.get("format") if isinstance(document, dict) else None
    if found in _OLD_FORMATS:
        raise ConfigError(f"Resume file {str(path)!r} was written by an older version of quantdbg ({found}); "
                          f"{_RESTART}.")
    raise FormatError(f"Resume file {str(path)!r} is not a quantdbg journal; choose another resume file "
                      "(or delete it if it is one of yours).")


def remove(path: str | os.PathLike) -> None:
    """Deletes the journal at ``path`` (``--restart``), also an older quantdbg's; nothing when absent.

    Raises:
        FormatError: The file is not a journal (it is left alone).
    """
    target = Path(path)
    if not target.exists():
        return
    try:
        _read(target)
    except ConfigError:
        pass  # an older or edited journal: still a journal, and this is what --restart is for
    target.unlink()


__all__ = ["EVALUATION", "FORMAT", "Journal", "canonical", "remove"]
