"""Walking JSON documents, for the fuzz tests that damage them."""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any


def json_paths(value: Any, prefix: tuple = ()) -> Iterator[tuple]:
    """Every path (keys and list indices) into ``value``, the empty path of the root first."""
    yield prefix
    if isinstance(value, dict):
        for key, item in value.items():
            yield from json_paths(item, (*prefix, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from json_paths(item, (*prefix, index))
