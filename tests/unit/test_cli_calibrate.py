"""``quantdbg calibrate`` through quantdbg.cli.main."""
from __future__ import annotations

import json
import struct

import models
import models_repairs
import numpy as np
import onnx
import pytest

from quantdbg.calibration import PercentileConfig
from quantdbg.cli import main
from quantdbg.cli.calibrate import calib_config
from quantdbg.config import CalibConfig
from quantdbg.errors import ConfigError
from quantdbg.qdq import quantize, records_from_model


@pytest.fixture
def files(tmp_path, rng):
    """An FP32 model and a calibration .npz (with a label array the command must ignore)."""
    model_path, data_path = tmp_path / "fp32.onnx", tmp_path / "calib.npz"
    onnx.save(models.conv_residual(), model_path)
    x = rng.standard_normal((20, 4, 8, 8)).astype(np.float32)
    np.savez(data_path, x=x, label=np.zeros(20, np.int64))
    return model_path, data_path, x


def test_writes_model_cache_and_scales(files, tmp_path, capsys):
    model_path, data_path, x = files
    before = model_path.read_bytes()
    out, cache, scales = tmp_path / "int8.onnx", tmp_path / "calib.cache", tmp_path / "scales.json"
    status = main(["calibrate", str(model_path), "--data", str(data_path), "--method", "minmax",
                   "--out", str(out), "--batch-size", "6", "--cache", str(cache), "--scales", str(scales),
                   "--no-progress"])
    assert status == 0
    stdout = capsys.readouterr().out
    assert stdout == (f"5 Q/DQ pairs on 3 nodes, calibrated on 20 samples in 4 batches; wrote {out}, "
                      f"{cache}, {scales}\n")
    qm = records_from_model(out)
    assert qm.layers == ("conv1", "conv2", "add")
    lines = cache.read_text().splitlines()
    assert lines[0] == "TRT-100300-MinMaxCalibration"
    by_tensor = dict(line.split(": ") for line in lines[1:])
    # x is a model input: its minmax scale is max|x| / 127 over all 20 samples, in big-endian hex
    (x_scale,) = struct.unpack(">f", bytes.fromhex(by_tensor["x"]))
    assert x_scale == pytest.approx(float(np.abs(x).max()) / 127, rel=1e-6)
    written = json.loads(scales.read_text())["tensors"]
    assert set(written) == {"x", "r1"} and written["x"]["scale"] == pytest.approx(x_scale, rel=1e-6)
    assert model_path.read_bytes() == before


def test_bias_correction_and_equalize_write_the_model_the_api_builds(tmp_path, rng):
    model_path, data_path, out = tmp_path / "chain.onnx", tmp_path / "calib.npz", tmp_path / "int8.onnx"
    onnx.save(models_repairs.conv_chain(0, spread=2.0), model_path)
    feed = {"x": rng.standard_normal((12, 3, 8, 8)).astype(np.float32),
            "z": rng.standard_normal((12, 16)).astype(np.float32)}
    np.savez(data_path, **feed)
    status = main(["calibrate", str(model_path), "--data", str(data_path), "--method", "minmax",
                   "--bias-correction", "--equalize", "--out", str(out), "--no-progress"])
    assert status == 0
    expected = quantize(str(model_path), feed, CalibConfig("minmax", bias_correction=True, equalize=True))
    assert {c.node for c in expected.calibration.bias_correction.corrections} == set(expected.layers)
    written = {i.name: i.raw_data for i in onnx.load(out).graph.initializer}
    assert written == {i.name: i.raw_data for i in expected.model.graph.initializer}
    assert any(name.endswith("/bias_corrected") for name in written)


def test_exclude_and_per_op(files, tmp_path, capsys):
    model_path, data_path, _ = files
    out = tmp_path / "int8.onnx"
    status = main(["calibrate", str(model_path), "--data", str(data_path), "--out", str(out),
                   "--exclude", "conv2", "--per-op", "Conv=percentile", "--percentile", "99.9",
                   "--no-progress"])
    assert status == 0
    assert capsys.readouterr().out.startswith("2 Q/DQ pairs on 1 node, calibrated on 20 samples in 1 batch;")
    assert records_from_model(out).layers == ("conv1",)


def test_calib_config_from_options():
    config = calib_config("entropy", ["Conv=percentile"], ["*head*=minmax"], 99.9)
    assert config.method == "entropy"
    assert dict(config.per_op) == {"Conv": PercentileConfig(99.9)}
    assert dict(config.per_tensor) == {"*head*": "minmax"}
    assert calib_config("percentile", [], [], None).method == "percentile"


@pytest.mark.parametrize(("extra", "message"), [
    (["--method", "entropi"],
     "No calibrator named 'entropi'. Did you mean 'entropy'? Registered: entropy, minmax, mse, percentile."),
    (["--per-op", "Conv"], "--per-op expects OP=METHOD, got 'Conv'."),
    (["--per-tensor", "=minmax"], "--per-tensor expects GLOB=METHOD, got '=minmax'."),
    (["--percentile", "99.9"],
     "--percentile sets the percentile calibrator, but neither --method, --per-op nor --per-tensor selects "
     "it; add --method percentile or drop --percentile."),
    (["--method", "percentile", "--percentile", "20"],
     "PercentileConfig.percentile must be in (50, 100], got 20.0."),
    (["--batch-size", "0"], "--batch-size must be >= 1, got 0."),
    (["--per-tensor", "x=mse", "r*=minmax", "rl=mse"],
     "CalibConfig.per_tensor entry 'rl' matches no tensor. No tensor named 'rl' in the model; the closest "
     "are 'r1' (6 in all)."),
    (["--nodes-to-exclude", "conv9"],
     "QuantConfig.exclude entry 'conv9' matches no node. No node named 'conv9' in the model. "
     "Did you mean 'conv2', 'conv1'?"),
])
def test_bad_options_give_one_line_and_status_2(files, tmp_path, capsys, extra, message):
    model_path, data_path, _ = files
    status = main(["calibrate", str(model_path), "--data", str(data_path), "--out", str(tmp_path / "o.onnx"),
                   "--no-progress", *extra])
    assert status == 2
    captured = capsys.readouterr()
    assert captured.err == f"quantdbg calibrate: error: {message}\n"
    assert not (tmp_path / "o.onnx").exists()


def test_bad_paths_give_one_line_and_status_2(files, tmp_path, capsys):
    model_path, data_path, _ = files
    cases = [
        ([str(tmp_path / "nope.onnx"), "--data", str(data_path), "--out", str(tmp_path / "o.onnx")],
         f"Model file {str(tmp_path / 'nope.onnx')!r} does not exist or is not a file."),
        ([str(model_path), "--data", str(tmp_path / "nope.npz"), "--out", str(tmp_path / "o.onnx")],
         f"Data file {str(tmp_path / 'nope.npz')!r} does not exist."),
        ([str(model_path), "--data", str(data_path), "--out", str(model_path)],
         f"--out {str(model_path)!r} is the input MODEL; choose another output path (inputs are never "
         "overwritten)."),
        ([str(model_path), "--data", str(data_path), "--out", str(tmp_path / "no" / "o.onnx")],
         f"--out {str(tmp_path / 'no' / 'o.onnx')!r}: folder {str(tmp_path / 'no')!r} does not exist."),
    ]
    for argv, message in cases:
        assert main(["calibrate", *argv, "--no-progress"]) == 2
        assert capsys.readouterr().err == f"quantdbg calibrate: error: {message}\n"


def test_calib_config_rejects_unknown_per_tensor_method():
    with pytest.raises(ConfigError, match=r"No calibrator named 'entropyy'"):
        calib_config("minmax", [], ["*=entropyy"], None)
