"""A malformed model file or cache is one error of the library's own type, naming the file or tensor."""
from __future__ import annotations

import hashlib
import math
import struct

import models_sensitivity as ms
import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from quantdbg.cli import main
from quantdbg.errors import ConfigError, DataError, ModelError
from quantdbg.model import load_model
from quantdbg.qdq.cache import format_trt_cache, parse_trt_cache

BASE = ms.mlp4()
BYTES = BASE.SerializeToString()


def _external(location: str) -> onnx.ModelProto:
    model = onnx.ModelProto()
    model.CopyFrom(BASE)
    tensor = model.graph.initializer[0]
    tensor.ClearField("raw_data")
    tensor.ClearField("float_data")
    tensor.data_location = onnx.TensorProto.EXTERNAL
    entry = tensor.external_data.add()
    entry.key, entry.value = "location", location
    return model


def _retyped(field: str) -> onnx.ModelProto:
    model = onnx.ModelProto()
    model.CopyFrom(BASE)
    if field == "elem_type":
        model.graph.input[0].type.tensor_type.elem_type = 99
    else:
        model.graph.initializer[0].data_type = 99
    return model


CASES = [
    ("missing external file", _external("absent.bin").SerializeToString(),
     r"^Cannot load the external weights of '.*x\.onnx': data file '.*absent\.bin' of tensor 'fc0\.w' does "
     r"not exist\. Put the data file beside the model as it was saved, or re-export the model\.$"),
    ("external location is a folder", _external("sub").SerializeToString(),
     r"^Cannot load the external weights of .*: data file '.*sub' of tensor 'fc0\.w' is not a regular file"),
    ("file:// location", _external("file:///etc/passwd").SerializeToString(),
     r"^Cannot load the external weights of .*: data file '.*file:/etc/passwd' of tensor 'fc0\.w' does not "
     r"exist"),
    ("NUL in location", _external("a\x00b").SerializeToString(),
     r"^Cannot load '.*x\.onnx': embedded null byte \(ValueError\)\."),
    ("node name not UTF-8", BYTES.replace(b"fc0", b"\xff\xfe\xfd", 1),
     r"^Cannot load '.*x\.onnx': 'utf-8' codec can't decode byte 0xff .*\(UnicodeDecodeError\)\."),
    ("unknown elem_type", _retyped("elem_type").SerializeToString(),
     r"^Tensor 'x' has elem_type 99, which ONNX does not define; re-export the model\.$"),
    ("unknown data_type", _retyped("data_type").SerializeToString(),
     r"^Initializer 'fc0\.w' has data_type 99, which ONNX does not define; re-export the model\.$"),
    ("truncated", BYTES[: len(BYTES) // 2], r"^Cannot parse '.*x\.onnx' as an ONNX model: "),
]


@pytest.mark.parametrize(("case", "raw", "pattern"), CASES, ids=[c[0] for c in CASES])
def test_a_malformed_model_is_one_model_error(tmp_path, case, raw, pattern):
    (tmp_path / "sub").mkdir()
    path = tmp_path / "x.onnx"
    path.write_bytes(raw)
    with pytest.raises(ModelError, match=pattern):
        load_model(path, allow_quantized=True)
    assert path.read_bytes() == raw


def test_the_cli_reports_a_malformed_model_in_one_line(tmp_path, capsys):
    path = tmp_path / "x.onnx"
    path.write_bytes(BYTES.replace(b"fc0", b"\xff\xfe\xfd", 1))
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    assert main(["lint", str(path), "--json", str(tmp_path / "l.json")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"quantdbg lint: error: Cannot load {str(path)!r}: 'utf-8' codec can't decode")
    assert err.count("\n") == 1 and "Traceback" not in err
    assert hashlib.sha256(path.read_bytes()).hexdigest() == digest
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.onnx"]


PROTOBUF_MUTANTS = 200
_FUZZ = settings(max_examples=PROTOBUF_MUTANTS, deadline=None, derandomize=True,
                 suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


WEIGHT_BYTES = {t.name: (BYTES.index(t.raw_data), len(t.raw_data)) for t in BASE.graph.initializer}
"""Initializer -> (offset, length) of its raw float32 data inside the serialized model."""
assert len({offset for offset, _ in WEIGHT_BYTES.values()}) == len(WEIGHT_BYTES)


def _weights_only(raw: bytes, flips: list[tuple[int, int]]) -> dict[str, bytes] | None:
    """The initializers' raw data when every flip lands inside it and leaves ordinary float32 weights
    (finite, within FP16's range): a model that must still load, with exactly these weights."""
    inside = all(any(o <= i < o + n for o, n in WEIGHT_BYTES.values()) for i, _ in flips)
    data = {name: raw[o:o + n] for name, (o, n) in WEIGHT_BYTES.items()}
    ordinary = all(np.all(np.abs(np.frombuffer(d, "<f4")) <= 65504) for d in data.values())  # NaN fails too
    return data if inside and ordinary else None


def test_mutated_protobufs_load_or_raise_model_error(tmp_path_factory):
    folder = tmp_path_factory.mktemp("fuzz")
    (folder / "genuine.onnx").write_bytes(BYTES)
    assert load_model(folder / "genuine.onnx", allow_quantized=True).SerializeToString() == BYTES
    outcomes = {"weights read back": 0, "loaded": 0, "refused": 0}

    @_FUZZ
    @given(st.lists(st.tuples(st.integers(0, len(BYTES) - 1), st.integers(0, 255)), min_size=1, max_size=4),
           st.integers(0, len(BYTES)))
    def run(flips, cut):
        raw = bytearray(BYTES)
        for index, value in flips:
            raw[index] = value
        truncated = cut % 7 == 0 and cut < len(raw)
        path = folder / "m.onnx"
        path.write_bytes(bytes(raw[:cut] if truncated else raw))
        weights = None if truncated else _weights_only(bytes(raw), flips)
        try:
            model = load_model(path, allow_quantized=True)
        except ModelError:
            assert weights is None, "a model whose weights alone changed was refused"
            outcomes["refused"] += 1
            return  # the one error a malformed model may raise
        outcomes["loaded"] += 1
        if weights is not None:
            assert {t.name: t.raw_data for t in model.graph.initializer} == weights
            outcomes["weights read back"] += 1

    run()
    assert outcomes["weights read back"] >= PROTOBUF_MUTANTS // 8, outcomes
    assert outcomes["refused"] >= PROTOBUF_MUTANTS // 20, outcomes


@pytest.mark.parametrize("value", [math.nan, math.inf, 0.0, -0.5])
def test_the_cache_reader_refuses_scales_that_are_not_finite_and_positive(value):
    text = "TRT-100300-EntropyCalibration2\n" + "".join(f"{name}: {struct.pack('>f', v).hex()}\n"
                                                        for name, v in (("x", 0.5), ("y", value)))
    with pytest.raises(DataError, match=rf"^c\.cache, line 3: tensor 'y' has scale {value}; a calibration "
                                        r"cache holds finite scales > 0\.$"):
        parse_trt_cache(text, "c.cache")


@pytest.mark.parametrize("name", ["a\rb", "a\x85b", "a\u2028b", "a\x0bb", "a\x1cb", " ", "a\ud800"])
def test_the_cache_writer_refuses_names_its_reader_cannot_read_back(name):
    with pytest.raises(ConfigError, match=r"^Tensor name .* cannot be written"):
        format_trt_cache({name: 0.5})


LINE_BREAKS = frozenset("\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029")
"""The line boundaries of str.splitlines, as Python's documentation lists them."""


def _unwritable(name: str) -> bool:
    """A name no cache line can carry: blank, across lines, or not UTF-8 (a lone surrogate)."""
    return name.isspace() or any(c in LINE_BREAKS or "\ud800" <= c <= "\udfff" for c in name)


GOOD_NAME = st.text(st.characters().filter(lambda c: c not in LINE_BREAKS), min_size=1, max_size=12).filter(
    lambda name: not name.isspace())
BAD_NAME = st.one_of(st.text(st.sampled_from(sorted(LINE_BREAKS | {" ", "\t"})), min_size=1, max_size=3),
                     st.tuples(GOOD_NAME, st.sampled_from(sorted(LINE_BREAKS)), GOOD_NAME).map("".join),
                     st.tuples(GOOD_NAME, st.just("\ud800")).map("".join))
NAME = st.integers(0, 9).flatmap(lambda draw: BAD_NAME if draw == 0 else GOOD_NAME)
"""Tensor names, one in ten of them one the cache format cannot carry."""

ROUND_TRIPS = 200


def test_every_cache_the_writer_accepts_reads_back_the_same_and_it_refuses_only_unwritable_names():
    outcomes = {"read back": 0, "refused": 0}

    @settings(max_examples=ROUND_TRIPS, deadline=None, derandomize=True)
    @given(st.dictionaries(NAME, st.floats(1e-30, 1e30), min_size=1, max_size=4))
    def run(scales):
        if any(_unwritable(name) for name in scales):
            with pytest.raises(ConfigError, match=r"^Tensor name .* cannot be written"):
                format_trt_cache(scales)
            outcomes["refused"] += 1
            return
        read = parse_trt_cache(format_trt_cache(scales))
        assert list(read.scales) == list(scales)
        assert list(read.scales.values()) == [float(np.float32(v)) for v in scales.values()]
        outcomes["read back"] += 1

    run()
    # Most examples reach the reader; the rest check the refusal (so neither half is left untested).
    assert outcomes["read back"] >= ROUND_TRIPS // 2 and outcomes["refused"] >= ROUND_TRIPS // 20, outcomes


CACHE_TEXTS = 300
ENTRY = st.tuples(GOOD_NAME, st.floats(1e-30, 1e30))
LINE = st.integers(0, 4).flatmap(lambda draw: st.text(max_size=40) if draw == 0 else ENTRY)
"""A cache line: a tensor entry, or (one in five) any text at all."""


def _bits(value: float) -> bytes:
    return struct.pack(">f", value)


def test_the_cache_reader_parses_or_raises_data_error():
    outcomes = {"read back": 0, "other": 0}

    @settings(max_examples=CACHE_TEXTS, deadline=None, derandomize=True)
    @given(st.lists(LINE, max_size=5))
    def run(lines):
        # Written the way TensorRT writes a cache: 'name: ' and the scale's float32 bits, big-endian hex.
        text = "TRT-100300-EntropyCalibration2\n" + "\n".join(
            line if isinstance(line, str) else f"{line[0]}: {_bits(line[1]).hex()}" for line in lines)
        entries = [line for line in lines if not isinstance(line, str)]
        if len(entries) == len(lines) and len({name for name, _ in entries}) == len(entries):
            parsed = parse_trt_cache(text)  # only well-formed entries: must read back, exactly
            assert dict(parsed.scales) == {name: struct.unpack(">f", _bits(v))[0] for name, v in entries}
            outcomes["read back"] += 1
            return
        outcomes["other"] += 1
        try:
            parsed = parse_trt_cache(text)
        except DataError:
            return
        assert all(math.isfinite(v) and v > 0 for v in parsed.scales.values())

    run()
    assert outcomes["read back"] >= CACHE_TEXTS // 6 and outcomes["other"] >= CACHE_TEXTS // 6, outcomes
