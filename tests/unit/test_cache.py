"""TensorRT calibration cache and JSON scales: hand-written lines, round trips, line-numbered errors."""
from __future__ import annotations

import json
import struct
from types import MappingProxyType

import models
import numpy as np
import pytest

from quantdbg.calibration import CalibrationResult, TensorRange, TensorStats
from quantdbg.errors import ConfigError, DataError, FormatError
from quantdbg.qdq import QdqRecord, QuantizedModel
from quantdbg.qdq import cache as cache


def _result() -> CalibrationResult:
    ranges = {"images": TensorRange("images", -1.0, 1.0, "entropy"),
              "block:0/relu_out": TensorRange("block:0/relu_out", -6.25, 6.25, "percentile")}
    stats = {name: TensorStats(name, -r.amax, r.amax, 10) for name, r in ranges.items()}
    return CalibrationResult(MappingProxyType(ranges), MappingProxyType(stats))


def test_hand_written_tensorrt_line_parses():
    parsed = cache.parse_trt_cache("TRT-8601-EntropyCalibration2\nimages: 3c010a14\n")
    assert (parsed.version, parsed.algorithm) == (8601, "EntropyCalibration2")
    # IEEE-754 by hand: sign 0, exponent 0x78 (2**-7), mantissa 0x010a14 / 2**23.
    expected = 2.0**-7 * (1 + 0x010A14 / 2**23)
    assert parsed.scales["images"] == pytest.approx(expected, rel=1e-7)
    assert parsed.scales["images"] == pytest.approx(0.0078759, rel=1e-4)
    assert parsed.amax()["images"] == pytest.approx(1.0, abs=1e-3)


def test_scale_hex_is_big_endian_float32():
    assert cache.scale_to_hex(1.0) == "3f800000"
    assert cache.scale_to_hex(-2.0) == "c0000000"
    assert cache.hex_to_scale("3c010a14") == struct.unpack(">f", bytes([0x3C, 0x01, 0x0A, 0x14]))[0]


def test_cache_round_trip(tmp_path):
    result = _result()
    path = cache.write_trt_cache(result, tmp_path / "calib.cache", version=100300)
    lines = path.read_text().splitlines()
    assert lines[0] == "TRT-100300-EntropyCalibration2"
    assert lines[1] == f"images: {struct.pack('>f', np.float32(1.0 / 127)).hex()}"
    again = cache.read_trt_cache(path)
    assert list(again.scales) == ["images", "block:0/relu_out"]  # file order; ':' in a name survives
    for name, r in result.ranges.items():
        assert again.scales[name] == float(np.float32(r.amax / 127))
    data = json.loads(json.dumps(again.to_dict()))
    assert data == {"scales": dict(again.scales), "version": 100300, "algorithm": "EntropyCalibration2"}
    back = cache.TrtCache.from_dict(data)
    assert back == again and isinstance(back.scales, MappingProxyType)


def test_cache_from_qdq_records_uses_inserted_activation_scales(tmp_path):
    record = QdqRecord("conv", "Conv", 0, "x", "activation", "q", "dq", (0.5,), None, "mse")
    weight = QdqRecord("conv", "Conv", 1, "w", "weight", "qw", "dqw", (0.1, 0.2), 0, "absmax")
    qmodel = QuantizedModel(model=None, records=(record, weight))  # type: ignore[arg-type]
    text = cache.format_trt_cache(qmodel)
    assert text == "TRT-100300-EntropyCalibration2\nx: 3f000000\n"
    entry = {"scale": 0.5, "amax": 63.5, "method": "mse"}
    assert cache.scales_of(qmodel).to_dict() == {"format": "quantdbg.scales/1", "tensors": {"x": entry}}
    (entry,) = cache.scale_entries(qmodel).values()
    assert cache.ScaleEntry.from_dict(json.loads(json.dumps(entry.to_dict()))) == entry


@pytest.mark.parametrize("text, message", [
    ("", r"line 1: expected a header like 'TRT-100300-EntropyCalibration2', found 'an empty file'"),
    ("TRT-abc-Entropy\n", r"line 1: expected a header .* found 'TRT-abc-Entropy'"),
    ("TRT-8601-EntropyCalibration2\na: 3c010a14\n\nb 3c010a14\n",
     r"line 4: expected 'tensor_name: <8 hex digits>'"),
    ("TRT-8601-EntropyCalibration2\na: 3c010a1\n",
     r"line 2: expected 'tensor_name: <8 hex digits>', found 'a: 3c010a1'"),
    ("TRT-8601-EntropyCalibration2\na: 3c010a14\na: 3c010a14\n", r"line 3: tensor 'a' appears twice"),
])
def test_parse_errors_name_the_line(text, message):
    with pytest.raises(DataError, match=message):
        cache.parse_trt_cache(text, "calib.cache")


def test_read_missing_cache_is_a_data_error(tmp_path):
    with pytest.raises(DataError, match="Cannot read calibration cache"):
        cache.read_trt_cache(tmp_path / "nope.cache")


@pytest.mark.parametrize("scales, message", [({"a": 0.0}, "scale 0.0"), ({"a": float("nan")}, "scale nan"),
                                             ({"a\nb": 1.0}, "cannot be written on one cache line")])
def test_invalid_scales_are_refused(scales, message):
    with pytest.raises(ConfigError, match=message):
        cache.format_trt_cache(scales)


def test_bad_header_fields_are_refused():
    with pytest.raises(ConfigError, match="version must be a non-negative integer"):
        cache.format_trt_cache({"a": 1.0}, version=-1)
    with pytest.raises(ConfigError, match="must be alphanumeric"):
        cache.format_trt_cache({"a": 1.0}, algorithm="Entropy Calibration")


def test_scales_json_round_trip(tmp_path):
    result = _result()
    path = cache.write_scales_json(result, tmp_path / "scales.json")
    data = cache.read_scales_json(path)
    assert data.tensors == {name: cache.ScaleEntry(r.scale, r.amax, r.method)
                            for name, r in result.ranges.items()}
    assert data.tensors["block:0/relu_out"].scale == float(np.float32(6.25 / 127))
    assert json.loads(path.read_text())["format"] == "quantdbg.scales/1"


def test_a_scales_file_of_the_previous_version_still_reads(tmp_path):
    # quantdbg 0.1.0 wrote tensor name -> entry with no tag; the codec recognises that form, and only it.
    path = tmp_path / "old.json"
    path.write_text(json.dumps({"x": {"scale": 0.5, "amax": 63.5, "method": "mse"}}))
    assert cache.read_scales_json(path).tensors == {"x": cache.ScaleEntry(0.5, 63.5, "mse")}
    path.write_text(json.dumps({"x": {"amax": 63.5}}))
    with pytest.raises(FormatError, match=r"not a valid quantdbg.scales/1 document: format is None"):
        cache.read_scales_json(path)


def test_scales_json_errors(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"format": "quantdbg.scales/1",
                               "tensors": {"x": {"scale": 0, "amax": 1.0, "method": None}}}))
    with pytest.raises(FormatError, match="tensor 'x' needs a finite positive 'scale'"):
        cache.read_scales_json(bad)
    bad.write_text("[1, 2")
    with pytest.raises(FormatError, match=r"bad.json': not valid JSON"):
        cache.read_scales_json(bad)


def test_writes_need_an_existing_folder(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        cache.write_trt_cache({"a": 1.0}, tmp_path / "missing" / "calib.cache")


def test_the_header_names_the_calibration_whoever_writes_the_cache(tmp_path, rng):
    """The Python API writes what the CLI writes: TensorRT's MinMax header for a pure max calibration."""
    from quantdbg import CalibConfig, quantize

    model = models.conv_relu()
    feeds = [{"x": rng.standard_normal((2, 3, 8, 8), dtype=np.float32)} for _ in range(2)]
    minmax = quantize(model, feeds, CalibConfig(method="minmax"))
    mixed = quantize(model, feeds, CalibConfig(method="minmax", per_tensor={"x": "entropy"}))
    header = {name: cache.write_trt_cache(q, tmp_path / f"{name}.cache").read_text().splitlines()[0]
              for name, q in (("minmax", minmax), ("mixed", mixed), ("calibration", minmax.calibration))}
    assert header == {"minmax": "TRT-100300-MinMaxCalibration", "mixed": "TRT-100300-EntropyCalibration2",
                      "calibration": "TRT-100300-MinMaxCalibration"}
    assert cache.format_trt_cache(minmax, algorithm="EntropyCalibration2").startswith("TRT-100300-Entropy")
    assert cache.format_trt_cache({"x": 0.5}).startswith("TRT-100300-EntropyCalibration2\n")
