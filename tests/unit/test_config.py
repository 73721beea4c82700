"""Config validation, calibrator choice by tensor glob and op type, and the configs' JSON form."""
from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import textwrap

import pytest

from quantdbg.calibration import EntropyConfig, PercentileConfig
from quantdbg.config import CalibConfig, QuantConfig
from quantdbg.errors import ConfigError, FormatError


def test_method_for_prefers_tensor_glob_then_op_then_default():
    config = CalibConfig(method="minmax", per_op={"Conv": "entropy"}, per_tensor={"*/head/*": "percentile"})
    assert config.method_for("model/head/x", ("Conv",)) == "percentile"
    assert config.method_for("model/body/x", ("Relu", "Conv")) == "entropy"
    assert config.method_for("model/body/x", ("MatMul",)) == "minmax"


def test_configs_are_frozen_and_maps_immutable():
    config = CalibConfig(per_op={"Conv": "entropy"})
    with pytest.raises(AttributeError):
        config.method = "minmax"
    with pytest.raises(TypeError):
        config.per_op["Gemm"] = "minmax"


@pytest.mark.parametrize("kwargs, message", [
    ({"num_bins": 1000}, "num_bins must be a power of two >= 128, got 1000"),
    ({"max_batches": 0}, "max_batches must be >= 1 or None, got 0"),
])
def test_calib_config_validation(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        CalibConfig(**kwargs)


def test_quant_config_exclusion_globs_and_validation():
    config = QuantConfig(exclude=["head/*", "stem"])
    assert config.is_excluded("head/fc") and config.is_excluded("stem") and not config.is_excluded("stem2")
    with pytest.raises(ConfigError, match="not one string"):
        QuantConfig(exclude="head/*")
    with pytest.raises(ConfigError, match="op_types is empty"):
        QuantConfig(op_types=())


def test_calib_config_json_form_and_round_trip():
    config = CalibConfig(method=PercentileConfig(99.5, 512), per_op={"Conv": "mse", "MatMul": "minmax"},
                         per_tensor={"b*": EntropyConfig(start_bin=256), "a*": "minmax"}, num_bins=256,
                         max_batches=3)
    data = json.loads(json.dumps(config.to_dict(), allow_nan=False))
    assert data == {  # the form files written before hold: choices as {calibrator, config}, maps as pairs
        "method": {"calibrator": "percentile", "config": {"percentile": 99.5, "num_bins": 512}},
        "per_op": [["Conv", {"calibrator": "mse", "config": None}],
                   ["MatMul", {"calibrator": "minmax", "config": None}]],
        "per_tensor": [["b*", {"calibrator": "entropy",
                               "config": dataclasses.asdict(EntropyConfig(start_bin=256))}],
                       ["a*", {"calibrator": "minmax", "config": None}]],
        "num_bins": 256, "max_batches": 3}
    again = CalibConfig.from_dict(data)
    assert again == config
    assert list(again.per_tensor) == ["b*", "a*"] and list(again.per_op) == ["Conv", "MatMul"]
    assert CalibConfig.from_dict(json.loads(json.dumps(CalibConfig().to_dict()))) == CalibConfig()


@pytest.mark.parametrize("change, message", [
    ({"method": {"calibrator": "entropi", "config": None}},
     "field 'method': No calibrator named 'entropi'. Did you mean 'entropy'?"),
    ({"per_op": [["Conv", {"calibrator": "percentile", "config": {"percentile": "high"}}]]},
     "field 'per_op[0][1].config.percentile': expected a number or \"nan\"/\"inf\"/\"-inf\", got \"high\""),
    ({"num_bins": 100}, "field '(top)': num_bins must be a power of two >= 128, got 100."),
    ({"per_tensor": {"*": "minmax"}}, "field 'per_tensor': expected a list, got dict"),
])
def test_calib_config_from_bad_json_names_the_field(change, message):
    data = {**CalibConfig().to_dict(), **change}
    with pytest.raises(FormatError) as err:
        CalibConfig.from_dict(data, "calib.json")
    assert str(err.value).startswith(f"calib.json: not a valid CalibConfig: {message}")


def test_quant_config_json_round_trip():
    config = QuantConfig(op_types=("Conv", "MatMul"), exclude=("head/*",), quantize_residual_add=False,
                         per_channel=False, share_concat_scales=False)
    data = json.loads(json.dumps(config.to_dict()))
    assert data == {"op_types": ["Conv", "MatMul"], "exclude": ["head/*"], "quantize_residual_add": False,
                    "per_channel": False, "share_concat_scales": False}
    assert QuantConfig.from_dict(data) == config
    assert QuantConfig.from_dict(json.loads(json.dumps(QuantConfig().to_dict()))) == QuantConfig()


def test_a_calibrator_config_reads_back_whatever_was_imported_before():
    # A fresh interpreter that imports only quantdbg.config reads a percentile config, refuses an
    # unknown name, and never imports the calibrators to do so.
    code = textwrap.dedent("""
        import sys
        from quantdbg.config import CalibConfig
        from quantdbg.errors import FormatError
        data = {"method": {"calibrator": "percentile", "config": {"percentile": 99.0}},
                "per_op": [["Conv", {"calibrator": "mse", "config": {"start_bin": 64}}]],
                "per_tensor": [], "num_bins": 2048, "max_batches": None}
        config = CalibConfig.from_dict(data)
        print(repr(config.method), repr(config.per_op["Conv"]))
        assert CalibConfig.from_dict(config.to_dict()) == config
        data["method"] = {"calibrator": "percentil", "config": None}
        try:
            CalibConfig.from_dict(data)
        except FormatError as err:
            print(err)
        assert "quantdbg.calibration" not in sys.modules
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.splitlines() == [
        "PercentileConfig(percentile=99.0, num_bins=None) MseConfig(num_bins=None, start_bin=64)",
        "<data>: not a valid CalibConfig: field 'method': No calibrator named 'percentil'. Did you mean "
        "'percentile'? Registered: entropy, minmax, mse, percentile."]
