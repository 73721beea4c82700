"""Resume fingerprints that say what differs.

A fingerprint is a short digest per ingredient that changes a score (the models, the data, the
metric, each file an evaluation command reads, ...) so that a journal written by another run is
refused with the ingredients that differ, not a bare "another run". :func:`digest` is the one
digest every key and checksum of quantdbg is made with.
"""
from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Mapping

import numpy as np


def digest(*parts: bytes | str) -> str:
    """A 16-digit hex SHA-256 of ``parts`` (each length-prefixed, so ``("ab", "c") != ("a", "bc")``)."""
    hasher = hashlib.sha256()
    for part in parts:
        data = part.encode("utf-8") if isinstance(part, str) else part
        hasher.update(len(data).to_bytes(8, "little"))
        hasher.update(data)
    return hasher.hexdigest()[:16]


def feeds_digest(feeds: Iterable[Mapping[str, np.ndarray]]) -> str:
    """Digest of every feed's input names, dtypes, shapes and bytes, in order."""
    hasher = hashlib.sha256()
    for feed in feeds:
        for name in sorted(feed):
            array = np.ascontiguousarray(feed[name])
            hasher.update(f"{name}|{array.dtype.str}|{array.shape}|".encode())
            hasher.update(array.tobytes())
    return hasher.hexdigest()[:16]


def array_digest(array: np.ndarray) -> str:
    """Digest of an array's dtype, shape and bytes."""
    array = np.ascontiguousarray(array)
    return digest(array.dtype.str, str(array.shape), array.tobytes())


def file_digest(path: str | os.PathLike) -> str:
    """:func:`digest` of a file's contents, read in chunks (the same value as ``digest(data)``)."""
    hasher = hashlib.sha256()
    with open(path, "rb") as file:
        hasher.update(os.fstat(file.fileno()).st_size.to_bytes(8, "little"))
        for chunk in iter(lambda: file.read(1 << 20), b""):
            hasher.update(chunk)
    return hasher.hexdigest()[:16]


def compose(parts: Mapping[str, str]) -> str:
    """The fingerprint of named ingredients as one line, e.g. ``models=1f..;data=9a..;mode=isolated``."""
    return ";".join(f"{name}={value}" for name, value in parts.items())


def differences(stored: Mapping[str, str], current: Mapping[str, str]) -> str:
    """What differs between the ingredients of a stored run and of the current one, for a message.

    Returns:
        E.g. ``"the metric and the evaluation data changed"`` (an ingredient only one of them has
        changed too), or ``"nothing changed"``.
    """
    changed = [name for name in {**current, **stored} if stored.get(name) != current.get(name)]
    if not changed:
        return "nothing changed"
    return f"the {' and the '.join(changed)} changed"


__all__ = ["array_digest", "compose", "differences", "digest", "feeds_digest", "file_digest"]
