"""Diagnostics documents that hold another package's value in that package's own JSON form.

A doctor report holds a sensitivity report (a document with its own ``format`` tag) and a doctor
configuration holds a calibrator configuration (written as ordered pairs). Those values keep the
form their own package writes and reads (``to_dict``/``from_dict``), nested as they are; every
other field goes through the shared codec (:mod:`quantdbg._json`).
"""
from __future__ import annotations

import dataclasses
import sys
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from quantdbg import _json
from quantdbg.errors import FormatError

T = TypeVar("T")


@dataclass(frozen=True)
class OwnForm:
    """How one field's value is written and read by its own package.

    Attributes:
        encode: Value -> JSON-ready data (e.g. ``SensitivityReport.to_dict``).
        decode: That data -> the value (e.g. ``SensitivityReport.from_dict``).
    """

    encode: Callable[[Any], Any]
    decode: Callable[[Any], Any]


def _hints(cls: Any) -> dict[str, Any]:
    module = sys.modules.get(cls.__module__)
    return typing.get_type_hints(cls, vars(module) if module else None)


def encode_fields(obj: Any, own: Mapping[str, OwnForm],
                  extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """JSON data of a dataclass, in field order, then the derived keys.

    Args:
        obj: The dataclass instance.
        own: Field name -> its own form; such a field holding None is written as null.
        extra: Derived keys (e.g. counts), written through the codec after the fields.

    Returns:
        JSON-ready data.
    """
    out = {}
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        mine = f.name in own and value is not None
        out[f.name] = own[f.name].encode(value) if mine else _json.encode(value)
    out.update({k: _json.encode(v) for k, v in (extra or {}).items()})
    return out


def decode_fields(cls: type[T], data: Any, where: str, own: Mapping[str, OwnForm]) -> T:
    """Inverse of :func:`encode_fields` (keys that are not fields are ignored).

    Args:
        cls: The dataclass to build.
        data: Parsed JSON.
        where: Path of ``data`` in its document, for messages ("" at the top).
        own: Field name -> its own form.

    Returns:
        The instance, validated by its own ``__post_init__``.

    Raises:
        FormatError: A field is missing or wrong (the message names it).
    """
    if not isinstance(data, dict):
        raise _json.fail(where, f"an object ({cls.__name__})", data)
    kwargs = {}
    hints = _hints(cls)
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if f.name not in data:
            continue  # a default applies, or construct() names the missing argument
        path = f"{where}.{f.name}" if where else f.name
        value = data[f.name]
        if f.name in own and value is not None:
            kwargs[f.name] = _own(own[f.name], value, path)
        else:
            kwargs[f.name] = _json.decode(hints[f.name], value, path)
    return _json.construct(cls, kwargs, where)


def _own(form: OwnForm, value: Any, path: str) -> Any:
    try:
        return form.decode(value)
    except FormatError as err:
        raise FormatError(f"field {path!r}: {err}") from err
    except (ValueError, KeyError, TypeError) as err:  # a package's reader refusing the data
        raise FormatError(f"field {path!r}: {type(err).__name__}: {err}") from err
