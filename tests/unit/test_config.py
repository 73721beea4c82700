"""Config validation and calibrator choice by tensor glob and op type."""
from __future__ import annotations

import pytest

from quantdbg.config import CalibConfig, QuantConfig
from quantdbg.errors import ConfigError


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
