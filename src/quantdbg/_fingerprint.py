"""Resume fingerprints that say what differs.

A fingerprint is a short digest per ingredient that changes a score (``models=..;data=..;metric=..``)
so that a resume file written by another run is refused with the ingredients that differ, not a
bare "another run".
"""
from __future__ import annotations

import hashlib
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


def compose(parts: Mapping[str, str]) -> str:
    """The fingerprint of named ingredients, e.g. ``models=1f..;data=9a..;mode=isolated``."""
    return ";".join(f"{name}={value}" for name, value in parts.items())


def differences(stored: object, current: str) -> str:
    """What differs between a stored fingerprint and the current one, for a message.

    Returns:
        E.g. ``"the metric and the data differ"``, or ``"it was written by another version or
        run"`` when the stored value is not a fingerprint of named ingredients.
    """
    theirs, ours = _parts(stored), _parts(current)
    if not theirs or set(theirs) != set(ours):
        return "it was written by another version of quantdbg or another kind of run"
    changed = [name for name in ours if theirs[name] != ours[name]]
    if not changed:
        return "nothing differs"
    return f"the {' and the '.join(changed)} differ" if len(changed) > 1 else f"the {changed[0]} differs"


def _parts(value: object) -> dict[str, str]:
    if not isinstance(value, str) or "=" not in value:
        return {}
    pairs = [item.partition("=") for item in value.split(";")]
    return {name: found for name, sep, found in pairs if sep}


__all__ = ["array_digest", "compose", "differences", "digest", "feeds_digest"]
