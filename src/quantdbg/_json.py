"""One JSON codec for the frozen dataclasses quantdbg reads and writes (configs, results, plans).

:func:`encode` turns a dataclass (or anything inside one) into JSON-ready data; :func:`decode` reads
it back, driven by the field annotations, and checks every value on the way: a wrong type, a
missing field or a value outside a ``Literal`` raises :class:`~quantdbg.errors.FormatError` naming
the field's path (``layers[3].rank``), never a bare KeyError or TypeError. Documents, the
top-level files, carry a ``format`` tag with a version (:func:`document`)::

    @document("quantdbg.sensitivity", 1)
    @dataclass(frozen=True)
    class SensitivityReport: ...

    write(report, "r.json")                       # {"format": "quantdbg.sensitivity/1", ...}
    report = read(SensitivityReport, "r.json")    # FormatError("r.json: field 'mode': ...")

Classes get ``to_dict``/``from_dict`` (and, for documents, ``write``/``read``) from the
:class:`Serializable` mixin instead of writing them by hand.

Every file quantdbg writes is a document, and this module's registry (:func:`document`) is the one
place that knows them: :func:`read_document` reads any of them by its tag. Files written before
their document had a tag (calibration results, lint reports and scales files of quantdbg 0.1.0) are
recognised here and nowhere else, by the ``untagged`` reader the class declares, and read as
version 1 of their document. All text is parsed by :func:`parse`, which refuses nesting deeper than
:data:`MAX_DEPTH` (no document comes near it) with a FormatError instead of a RecursionError.

Conventions: non-finite floats travel as ``"nan"``/``"inf"``/``"-inf"``; enums as their values;
tuples, lists and sets as lists; mappings with string keys as objects (others as ``[key, value]``
pairs); NumPy arrays as nested lists, decoded to the dtype given by the field's ``json_array``
metadata. A class may take over its own form with ``__json_encode__(self)`` and the classmethod
``__json_decode__(cls, data, where)``, and add derived, read-only keys with ``__json_extra__(self)``
(decoding ignores keys it does not know).
"""
from __future__ import annotations

import dataclasses
import enum
import functools
import json
import math
import os
import sys
import types
import typing
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from quantdbg._io import write_json_atomic
from quantdbg.errors import FormatError

T = TypeVar("T")

_ARRAY_KEY = "json_array"
_TRANSIENT_KEY = "json_transient"
_OPTIONAL_KEY = "json_optional"
_FORMAT = "format"


def json_array(dtype: Any) -> dict[str, Any]:
    """Field metadata: the field holds a NumPy array of ``dtype`` (``field(metadata=json_array(...))``)."""
    return {_ARRAY_KEY: np.dtype(dtype)}


def transient() -> dict[str, Any]:
    """Field metadata: the field says how to run, not what (e.g. an executor); it is left out of the
    JSON form and takes its default when read back (``field(default=None, metadata=transient())``)."""
    return {_TRANSIENT_KEY: True}


def optional() -> dict[str, Any]:
    """Field metadata: the field is left out of the JSON form while it is None, so a field added
    later keeps the files written without it as they were, and they read back with None
    (``field(default=None, metadata=optional())``)."""
    return {_OPTIONAL_KEY: True}


def stored(value: Any, f: dataclasses.Field) -> bool:
    """Whether field ``f`` of dataclass ``value`` goes in its JSON form (for classes that write
    their own form with ``__json_encode__``)."""
    if not f.init or f.metadata.get(_TRANSIENT_KEY):
        return False
    return not (f.metadata.get(_OPTIONAL_KEY) and getattr(value, f.name) is None)


# --------------------------------------------------------------------------------------------
# Encoding
# --------------------------------------------------------------------------------------------

def encode_float(value: float) -> float | str:
    """A float for strict JSON: ``"nan"``, ``"inf"`` and ``"-inf"`` for the non-finite ones."""
    value = float(value)
    if math.isfinite(value):
        return value
    return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")


def encode(value: Any) -> Any:
    """JSON-ready data for ``value`` (see the module docstring for the conventions)."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, enum.Enum):
        return encode(value.value)
    if isinstance(value, (int, np.integer)) and not isinstance(value, np.bool_):
        return int(value)
    if isinstance(value, (float, np.floating)):
        return encode_float(float(value))
    if isinstance(value, np.bool_):
        return bool(value)
    if isinstance(value, np.ndarray):
        return [encode(v) for v in value.tolist()] if value.ndim else encode(value.item())
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _encode_dataclass(value)
    if isinstance(value, Mapping):
        if all(isinstance(k, str) for k in value):
            return {k: encode(v) for k, v in value.items()}
        return [[encode(k), encode(v)] for k, v in value.items()]
    if isinstance(value, (set, frozenset)):
        return [encode(v) for v in sorted(value)]
    if isinstance(value, (list, tuple)):
        return [encode(v) for v in value]
    raise TypeError(f"Cannot encode a {type(value).__name__} as JSON.")


def _encode_dataclass(value: Any) -> Any:
    tag = getattr(type(value), "__json_format__", None)  # a document keeps its tag when nested too
    custom = getattr(value, "__json_encode__", None)
    if custom is not None:
        own = custom()
        return {_FORMAT: tag, **own} if tag is not None else own
    out = {} if tag is None else {_FORMAT: tag}
    out.update({f.name: encode(getattr(value, f.name))
                for f in dataclasses.fields(value) if stored(value, f)})
    extra = getattr(value, "__json_extra__", None)
    if extra is not None:
        out.update({k: encode(v) for k, v in extra().items()})
    return out


# --------------------------------------------------------------------------------------------
# Decoding
# --------------------------------------------------------------------------------------------

def _show(data: Any) -> str:
    text = json.dumps(data) if isinstance(data, (str, int, float, bool, type(None))) else type(data).__name__
    return text if len(text) <= 40 else text[:37] + "..."


def fail(where: str, expected: str, data: Any) -> FormatError:
    """The error for a value that is not what its field needs."""
    return FormatError(f"field {where or '(top)'!r}: expected {expected}, got {_show(data)}")


def decode_float(data: Any, where: str) -> float:
    """A float written by :func:`encode_float`."""
    if isinstance(data, bool) or not isinstance(data, (int, float, str)):
        raise fail(where, "a number", data)
    if isinstance(data, str):
        if data not in ("nan", "inf", "-inf"):
            raise fail(where, 'a number or "nan"/"inf"/"-inf"', data)
        return float(data)
    try:
        return float(data)
    except OverflowError as err:  # an integer too large for a float
        raise fail(where, "a number a float can hold", data) from err


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    module = sys.modules.get(cls.__module__)
    return typing.get_type_hints(cls, vars(module) if module else None)


def decode(tp: Any, data: Any, where: str = "") -> Any:
    """Reads ``data`` as a value of type ``tp``, checking it (FormatError names ``where``)."""
    if tp is Any or tp is object:
        return data
    origin = typing.get_origin(tp)
    if origin is typing.Union or origin is types.UnionType:
        return _decode_union(typing.get_args(tp), data, where)
    if origin is typing.Literal:
        if data not in typing.get_args(tp) or isinstance(data, bool) != any(
                isinstance(a, bool) for a in typing.get_args(tp) if a == data):
            choices = ", ".join(json.dumps(a) for a in typing.get_args(tp))
            raise fail(where, f"one of {choices}", data)
        return data
    if origin is not None:
        return _decode_generic(origin, typing.get_args(tp), data, where)
    return _decode_plain(tp, data, where)


def _decode_union(args: tuple[Any, ...], data: Any, where: str) -> Any:
    if data is None and type(None) in args:
        return None
    errors = []
    for arg in args:
        if arg is type(None):
            continue
        try:
            return decode(arg, data, where)
        except FormatError as err:
            errors.append(err)
    raise errors[0] if len(errors) == 1 else fail(where, " or ".join(_name(a) for a in args), data)


def _name(tp: Any) -> str:
    return "null" if tp is type(None) else getattr(tp, "__name__", str(tp))


def _decode_generic(origin: Any, args: tuple[Any, ...], data: Any, where: str) -> Any:
    if origin is tuple or origin in (list, set, frozenset, typing.Sequence) or \
            origin.__name__ in ("Sequence", "Collection", "Iterable"):
        if not isinstance(data, list):
            raise fail(where, "a list", data)
        if origin is tuple and args and args[-1] is not Ellipsis:
            if len(args) != len(data):
                raise fail(where, f"a list of {len(args)} items", data)
            pairs = enumerate(zip(args, data, strict=True))
            return tuple(decode(a, v, f"{where}[{i}]") for i, (a, v) in pairs)
        item = args[0] if args else Any
        values = [decode(item, v, f"{where}[{i}]") for i, v in enumerate(data)]
        if origin is list:
            return values
        return frozenset(values) if origin in (set, frozenset) else tuple(values)
    if origin in (dict, Mapping) or origin.__name__ == "Mapping":
        return _decode_mapping(args, data, where)
    if origin is type:
        raise fail(where, "a value (types are not JSON)", data)
    return decode(origin, data, where)


def _decode_mapping(args: tuple[Any, ...], data: Any, where: str) -> dict[Any, Any]:
    key_type, value_type = args if args else (Any, Any)
    if isinstance(data, dict):
        items = list(data.items())
    elif isinstance(data, list) and all(isinstance(p, list) and len(p) == 2 for p in data):
        items = [(k, v) for k, v in data]
    else:
        raise fail(where, "an object", data)
    return {decode(key_type, k, f"{where}.<key>"): decode(value_type, v, f"{where}.{k}") for k, v in items}


def _decode_plain(tp: Any, data: Any, where: str) -> Any:
    if tp is type(None):
        if data is not None:
            raise fail(where, "null", data)
        return None
    if tp is bool:
        if not isinstance(data, bool):
            raise fail(where, "true or false", data)
        return data
    if tp is int:
        if isinstance(data, bool) or not isinstance(data, int):
            raise fail(where, "an integer", data)
        return data
    if tp is float:
        return decode_float(data, where)
    if tp is str:
        if not isinstance(data, str):
            raise fail(where, "a string", data)
        return data
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        try:
            return tp(data)
        except ValueError as err:
            raise fail(where, f"one of {', '.join(json.dumps(m.value) for m in tp)}", data) from err
    if tp is Path:
        if not isinstance(data, str):
            raise fail(where, "a path string", data)
        return Path(data)
    if dataclasses.is_dataclass(tp):
        return _decode_dataclass(tp, data, where)
    if isinstance(tp, type) and not isinstance(data, tp):
        raise fail(where, f"a {tp.__name__}", data)
    return data


def _decode_dataclass(cls: type, data: Any, where: str) -> Any:
    tag = getattr(cls, "__json_format__", None)
    if tag is not None:
        if not isinstance(data, dict):
            raise fail(where, f"an object ({cls.__name__})", data)
        data = _tagged(cls, data)
        if data.get(_FORMAT) != tag:
            path = f"{where}.{_FORMAT}" if where else _FORMAT
            raise FormatError(f"field {path!r} is {data.get(_FORMAT)!r}, expected {tag!r}")
        data = {k: v for k, v in data.items() if k != _FORMAT}
    custom = getattr(cls, "__json_decode__", None)
    if custom is not None:
        return custom(data, where)
    if not isinstance(data, dict):
        raise fail(where, f"an object ({cls.__name__})", data)
    hints = _hints(cls)
    kwargs = {}
    for f in dataclasses.fields(cls):
        if not f.init or f.metadata.get(_TRANSIENT_KEY):
            continue
        path = f"{where}.{f.name}" if where else f.name
        if f.name not in data:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise FormatError(f"field {path!r} is missing")
            continue
        dtype = f.metadata.get(_ARRAY_KEY)
        kwargs[f.name] = decode_array(data[f.name], dtype, path) if dtype is not None \
            else decode(hints[f.name], data[f.name], path)
    return construct(cls, kwargs, where)


def construct(cls: Callable[..., T], kwargs: Mapping[str, Any], where: str) -> T:
    """``cls(**kwargs)``; a value its own validation refuses becomes a FormatError at ``where``."""
    try:
        return cls(**kwargs)
    except FormatError:
        raise
    except (ValueError, TypeError) as err:  # the class's __post_init__ refused a value
        raise FormatError(f"field {where or '(top)'!r}: {err}") from err


def decode_array(data: Any, dtype: np.dtype | None, where: str) -> np.ndarray | None:
    """A NumPy array of ``dtype`` from nested lists (None stays None); ragged or mistyped data fails."""
    if data is None:
        return None
    try:
        values = np.asarray(data if not isinstance(data, list) else _floats(data, dtype), dtype=dtype)
    except (ValueError, TypeError, OverflowError) as err:
        raise fail(where, f"a rectangular array of {np.dtype(dtype).name}", data) from err
    if values.dtype == object:
        raise fail(where, "a rectangular array of numbers", data)
    return values


def _floats(data: list[Any], dtype: np.dtype | None) -> list[Any]:
    if dtype is None or np.dtype(dtype).kind != "f":
        return data
    return [_floats(v, dtype) if isinstance(v, list) else (float(v) if v in ("nan", "inf", "-inf") else v)
            for v in data]


# --------------------------------------------------------------------------------------------
# Documents: top-level files with a format tag
# --------------------------------------------------------------------------------------------

Untagged = Callable[[dict[str, Any]], "dict[str, Any] | None"]
"""Recognises a document's untagged form (written before it had a tag): the fields to read as
version 1, or None when the data is not that document."""

_DOCUMENTS: dict[str, type] = {}
_UNTAGGED: dict[str, Untagged] = {}


def document(name: str, version: int, *, untagged: Untagged | None = None) -> Callable[[type[T]], type[T]]:
    """Class decorator: the class is a document written with ``"format": "<name>/<version>"``.

    Args:
        name: The document's name (``quantdbg.<what>``).
        version: Its version; a file of another version is refused.
        untagged: For a document that earlier versions wrote without a tag: recognises such a
            file (see :data:`Untagged`).
    """
    def decorate(cls: type[T]) -> type[T]:
        cls.__json_format__ = f"{name}/{version}"  # type: ignore[attr-defined]
        _DOCUMENTS[name] = cls
        if untagged is not None:
            _UNTAGGED[name] = untagged
        return cls
    return decorate


def format_of(cls: type) -> str:
    """The ``format`` tag of a document class."""
    return cls.__json_format__  # type: ignore[attr-defined, no-any-return]


def document_types() -> Mapping[str, type]:
    """Document name (without version) -> class, for the classes imported so far."""
    return types.MappingProxyType(_DOCUMENTS)


def dump(value: Any) -> dict[str, Any]:
    """A document's JSON data, its format tag first."""
    format_of(type(value))  # refuses a class that is not a document
    return encode(value)  # type: ignore[no-any-return]


def load(cls: type[T], data: Any, source: str = "<data>") -> T:
    """Reads a document of class ``cls`` from parsed JSON.

    Raises:
        FormatError: The data is not a ``cls`` document of this version, or a field is wrong;
            the message names ``source`` and the field.
    """
    expected = format_of(cls)
    try:
        if not isinstance(data, dict):
            raise fail("", f"a JSON object ({expected})", data)
        data = _tagged(cls, data)
        found = data.get(_FORMAT)
        if found != expected:
            raise FormatError(f"format is {found!r}, expected {expected!r}")
        return decode(cls, data)  # type: ignore[no-any-return]
    except FormatError as err:
        raise FormatError(f"{source}: not a valid {expected} document: {_clause(err)}. Re-create it with "
                          "the quantdbg command that wrote it.") from None


def _clause(err: Exception) -> str:
    """An error's text without its final period, to go inside a sentence."""
    return str(err).rstrip(".")


def _tagged(cls: type, data: dict[str, Any]) -> dict[str, Any]:
    """``data``, with its tag when it is ``cls``'s untagged form from an earlier version."""
    if _FORMAT in data:
        return data
    name, _, version = format_of(cls).rpartition("/")
    reader = _UNTAGGED.get(name)
    fields = reader(data) if reader is not None and version == "1" else None
    return data if fields is None else {_FORMAT: format_of(cls), **fields}


def detect(data: Any, source: str = "<data>") -> type:
    """The document class of parsed JSON: by its ``format`` tag, or an untagged earlier form.

    Only the classes imported so far are known (:func:`document_types`).

    Raises:
        FormatError: Not a JSON object, or no known document (the message names ``source`` and
            lists the documents known).
    """
    if isinstance(data, dict):
        tag = data.get(_FORMAT)
        if tag is None:
            found = next((_DOCUMENTS[n] for n, reader in _UNTAGGED.items() if reader(data) is not None), None)
        else:
            found = _DOCUMENTS.get(str(tag).rpartition("/")[0]) if isinstance(tag, str) else None
        if found is not None:
            return found
        what = "no 'format' tag" if tag is None else f"format {_show(tag)}"
    else:
        what = f"a JSON {type(data).__name__}, not an object"
    known = ", ".join(sorted(format_of(c) for c in _DOCUMENTS.values()))
    raise FormatError(f"{source}: not a quantdbg document ({what}); known: {known}.")


def read_document(path: str | os.PathLike) -> Any:
    """Reads any document file by its tag (:func:`detect`, then :func:`load`).

    Raises:
        FormatError: Unreadable, not JSON, not a known document, or a field is wrong.
    """
    source = repr(os.fspath(path))
    data = read_json(path)
    return load(detect(data, source), data, source)


MAX_DEPTH = 64
"""Deepest nesting of arrays and objects :func:`parse` accepts. quantdbg's documents nest about ten
levels; a limit far below the interpreter's recursion limit keeps every later walk (decoding,
rendering, re-encoding) safe."""


def parse(text: str | bytes, source: str) -> Any:
    """``json.loads`` whose failures are FormatErrors naming ``source``: bad syntax or encoding,
    nesting deeper than :data:`MAX_DEPTH`, numbers too long to convert."""
    too_deep = FormatError(f"{source}: JSON nested deeper than {MAX_DEPTH} levels; no quantdbg document is, "
                           "so this file was not written by quantdbg.")
    try:
        data = json.loads(text)
    except RecursionError:  # deeper than the interpreter's recursion limit: the same refusal
        raise too_deep from None
    except ValueError as err:  # UnicodeDecodeError is a ValueError
        raise FormatError(f"{source}: not valid JSON ({type(err).__name__}: {err}).") from None
    if _depth_exceeds(data, MAX_DEPTH):
        raise too_deep
    return data


def _depth_exceeds(data: Any, limit: int) -> bool:
    """Whether containers nest deeper than ``limit`` (level by level: no recursion on hostile data)."""
    level = [data] if isinstance(data, (list, dict)) else []
    for _ in range(limit):
        if not level:
            return False
        level = [child for node in level for child in (node.values() if isinstance(node, dict) else node)
                 if isinstance(child, (list, dict))]
    return bool(level)


def read_json(path: str | os.PathLike) -> Any:
    """Parsed JSON of a file; unreadable or malformed files raise FormatError naming the file."""
    try:
        raw = Path(path).read_bytes()
    except OSError as err:
        raise FormatError(f"Cannot read {os.fspath(path)!r}: {err.strerror or err}.") from err
    return parse(raw, repr(os.fspath(path)))


def read(cls: type[T], path: str | os.PathLike) -> T:
    """Reads a document file written by :func:`dump` (see :func:`load` for the errors)."""
    return load(cls, read_json(path), repr(os.fspath(path)))


def write(value: Any, path: str | os.PathLike) -> Path:
    """Writes a document as indented, key-sorted JSON, atomically."""
    return write_json_atomic(path, dump(value))


class Serializable:
    """Mixin for frozen dataclasses: ``to_dict``/``from_dict`` (and ``write``/``read`` for documents)
    through this module's codec, so no class writes its own JSON form."""

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready data (a document's with its format tag)."""
        return dump(self) if hasattr(type(self), "__json_format__") else encode(self)  # type: ignore[no-any-return]

    @classmethod
    def from_dict(cls: type[T], data: Any, source: str = "<data>") -> T:
        """Reads :meth:`to_dict` output back, checking every field.

        Raises:
            FormatError: The data does not have this class's structure (the field is named).
        """
        if hasattr(cls, "__json_format__"):
            return load(cls, data, source)
        try:
            return decode(cls, data)  # type: ignore[no-any-return]
        except FormatError as err:
            raise FormatError(f"{source}: not a valid {cls.__name__}: {_clause(err)}.") from None

    def write(self, path: str | os.PathLike) -> Path:
        """Writes :meth:`to_dict` as JSON atomically (documents only)."""
        return write(self, path)

    @classmethod
    def read(cls: type[T], path: str | os.PathLike) -> T:
        """Reads a document file written by :meth:`write`.

        Raises:
            FormatError: The file is unreadable, not JSON, or not this document (file and field named).
        """
        return read(cls, path)
