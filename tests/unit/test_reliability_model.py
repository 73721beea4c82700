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


_FUZZ = settings(max_examples=200, deadline=None, derandomize=True,
                 suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


@_FUZZ
@given(st.lists(st.tuples(st.integers(0, len(BYTES) - 1), st.integers(0, 255)), min_size=1, max_size=4),
       st.integers(0, len(BYTES)))
def test_mutated_protobufs_load_or_raise_model_error(tmp_path_factory, flips, cut):
    raw = bytearray(BYTES)
    for index, value in flips:
        raw[index] = value
    path = tmp_path_factory.mktemp("fuzz") / "m.onnx"
    path.write_bytes(bytes(raw[:cut] if cut % 7 == 0 else raw))
    try:
        load_model(path, allow_quantized=True)
    except ModelError:
        pass  # the one error a malformed model may raise


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


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.dictionaries(st.text(min_size=1, max_size=12), st.floats(1e-30, 1e30), min_size=1, max_size=4))
def test_every_cache_the_writer_accepts_reads_back_the_same(scales):
    try:
        text = format_trt_cache(scales)
    except ConfigError:
        return  # a name the reader could not read back: refused up front
    read = parse_trt_cache(text)
    assert list(read.scales) == list(scales)
    assert list(read.scales.values()) == [float(np.float32(v)) for v in scales.values()]


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.text(max_size=200))
def test_the_cache_reader_parses_or_raises_data_error(text):
    try:
        parsed = parse_trt_cache("TRT-100300-EntropyCalibration2\n" + text)
    except DataError:
        return
    assert all(math.isfinite(v) and v > 0 for v in parsed.scales.values())
