"""The dataclass JSON codec: round trips, and one FormatError naming the field for every bad value."""
from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Literal

import numpy as np
import pytest

from quantdbg import _json
from quantdbg.errors import FormatError


class Color(str, Enum):
    RED = "red"
    BLUE = "blue"


@dataclass(frozen=True)
class Inner:
    name: str
    value: float
    counts: np.ndarray | None = field(default=None, metadata=_json.json_array(np.int64))


@_json.document("test.outer", 2)
@dataclass(frozen=True)
class Outer:
    mode: Literal["a", "b"]
    items: tuple[Inner, ...]
    table: Mapping[str, float]
    color: Color = Color.RED
    limit: int | None = None
    flag: bool = False

    def __post_init__(self) -> None:
        if self.limit is not None and self.limit < 0:
            raise ValueError(f"limit must be >= 0, got {self.limit}")

    def __json_extra__(self) -> dict[str, object]:
        return {"n_items": len(self.items)}


def _outer() -> Outer:
    return Outer("b", (Inner("x", math.inf, np.array([1, 2, 3])), Inner("y", math.nan)),
                 {"p": -math.inf, "q": 0.5}, Color.BLUE, 3, True)


def test_round_trip_through_strict_json():
    value = _outer()
    text = json.dumps(_json.dump(value), allow_nan=False)  # strict JSON: no bare NaN/Infinity
    data = json.loads(text)
    assert data["format"] == "test.outer/2" and data["n_items"] == 2
    assert data["items"][0]["value"] == "inf" and data["table"]["p"] == "-inf"
    again = _json.load(Outer, data)
    assert again.mode == "b" and again.color is Color.BLUE and again.limit == 3 and again.flag is True
    assert again.items[0].value == math.inf and math.isnan(again.items[1].value)
    assert again.items[0].counts.dtype == np.int64 and again.items[0].counts.tolist() == [1, 2, 3]
    assert again.items[1].counts is None
    assert dict(again.table) == {"p": -math.inf, "q": 0.5}


def _bad(path: str, message: str, **changes: object) -> None:
    data = json.loads(json.dumps(_json.dump(_outer())))
    target = data
    keys = path.split(".")
    for key in keys[:-1]:
        target = target[int(key)] if isinstance(target, list) else target[key]
    if changes.get("delete"):
        del target[keys[-1]]
    else:
        target[keys[-1]] = changes["value"]
    with pytest.raises(FormatError) as err:
        _json.load(Outer, data, "r.json")
    assert str(err.value) == f"r.json: not a valid test.outer/2 document: {message}. Re-create it with " \
                             "the quantdbg command that wrote it."


@pytest.mark.parametrize(("path", "value", "message"), [
    ("mode", "c", "field 'mode': expected one of \"a\", \"b\", got \"c\""),
    ("items.0.value", "big",
     "field 'items[0].value': expected a number or \"nan\"/\"inf\"/\"-inf\", got \"big\""),
    ("items.1.name", 7, "field 'items[1].name': expected a string, got 7"),
    ("items", {"a": 1}, "field 'items': expected a list, got dict"),
    ("limit", True, "field 'limit': expected an integer, got true"),
    ("limit", -1, "field '(top)': limit must be >= 0, got -1"),
    ("color", "green", "field 'color': expected one of \"red\", \"blue\", got \"green\""),
    ("flag", 1, "field 'flag': expected true or false, got 1"),
    ("items.0.counts", [[1, 2], [3]],
     "field 'items[0].counts': expected a rectangular array of int64, got list"),
    ("table", [1, 2], "field 'table': expected an object, got list"),
    ("format", "test.outer/1", "format is 'test.outer/1', expected 'test.outer/2'"),
])
def test_each_bad_value_names_its_field(path, value, message):
    _bad(path, message, value=value)


def test_a_missing_required_field_is_named():
    _bad("mode", "field 'mode' is missing", delete=True)


def test_unknown_keys_and_missing_defaults_are_fine():
    data = {"format": "test.outer/2", "mode": "a", "items": [], "table": {}, "future_key": 1}
    assert _json.load(Outer, data) == Outer("a", (), {})


def test_parse_errors_name_the_source(tmp_path):
    with pytest.raises(FormatError, match=r"^'x.json': not valid JSON \(JSONDecodeError"):
        _json.parse("{", "'x.json'")
    with pytest.raises(FormatError, match=r"^'deep.json': JSON nested deeper than 64 levels"):
        _json.parse("[" * 100000 + "]" * 100000, "'deep.json'")
    with pytest.raises(FormatError, match=r"^Cannot read '.*missing.json': No such file"):
        _json.read(Outer, tmp_path / "missing.json")
    with pytest.raises(FormatError, match=r"expected a JSON object \(test.outer/2\), got 1"):
        _json.load(Outer, 1)


def test_encode_refuses_what_json_cannot_hold():
    with pytest.raises(TypeError, match="Cannot encode a object as JSON"):
        _json.encode(object())


def test_parse_refuses_nesting_deeper_than_any_document_before_anything_walks_it():
    text = "[" * (_json.MAX_DEPTH + 1) + "]" * (_json.MAX_DEPTH + 1)  # json.loads itself accepts this
    assert json.loads(text)
    with pytest.raises(FormatError, match=rf"^'d.json': JSON nested deeper than {_json.MAX_DEPTH} levels"):
        _json.parse(text, "'d.json'")
    deep: object = 0
    for level in range(_json.MAX_DEPTH):  # objects and arrays alternate, MAX_DEPTH levels: accepted
        deep = {"a": deep} if level % 2 else [deep]
    assert _json.parse(json.dumps(deep), "x") == deep
    with pytest.raises(FormatError, match="nested deeper"):
        _json.parse(json.dumps({"b": deep}), "x")


def _legacy(data: dict) -> dict | None:
    return {"items": data["old_items"], "mode": "a", "table": {}} if "old_items" in data else None


@_json.document("test.legacy", 1, untagged=_legacy)
@dataclass(frozen=True)
class Legacy:
    mode: Literal["a", "b"]
    items: tuple[Inner, ...]
    table: Mapping[str, float]


def test_documents_are_found_by_their_tag_or_their_untagged_earlier_form(tmp_path):
    assert _json.detect(_json.dump(_outer())) is Outer
    assert _json.detect({"old_items": []}) is Legacy
    expected = Legacy("a", (Inner("x", 1.0),), {})
    assert _json.load(Legacy, {"old_items": [{"name": "x", "value": 1.0}]}) == expected
    # Only a version-1 document has an untagged form, and only data its reader recognises is read as it.
    with pytest.raises(FormatError, match="format is None, expected 'test.legacy/1'"):
        _json.load(Legacy, {"items": []})
    unknown = (({"x": 1}, r"no 'format' tag"), ({"format": "test.nothing/1"}, 'format "test.nothing/1"'),
               ([1], "a JSON list, not an object"))
    for data, what in unknown:
        with pytest.raises(FormatError, match=rf"^src: not a quantdbg document \({what}\); known: .*test"):
            _json.detect(data, "src")
    path = tmp_path / "old.json"
    path.write_text(json.dumps({"old_items": []}))
    assert _json.read_document(path) == Legacy("a", (), {})


def test_nested_documents_read_their_untagged_earlier_form_too():
    @dataclass(frozen=True)
    class Holder:
        inner: Legacy

    assert _json.decode(Holder, {"inner": {"old_items": []}}) == Holder(Legacy("a", (), {}))


def test_every_json_text_quantdbg_reads_goes_through_parse():
    # One codec: a json.load(s) elsewhere would skip parse's checks (depth, errors naming the file).
    import ast
    from pathlib import Path

    src = Path(_json.__file__).parent
    calls = []
    for path in sorted(src.rglob("*.py")):
        if path.name == "_json.py" and path.parent == src:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Attribute) and node.attr in ("load", "loads") \
                    and isinstance(node.value, ast.Name) and node.value.id == "json":
                calls.append(f"{path.relative_to(src)}:{node.lineno}")
            if isinstance(node, ast.ImportFrom) and node.module == "json":
                calls.append(f"{path.relative_to(src)}:{node.lineno} (from json import)")
    assert calls == []
