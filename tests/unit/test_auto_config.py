"""AutoConfig and the repair configs: validation with exact messages, the share limit, JSON round trips
(configs and the repair records)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from quantdbg.calibration import PercentileConfig, SmoothingConfig
from quantdbg.config import CalibConfig, Precision, QuantConfig
from quantdbg.errors import ConfigError, FormatError
from quantdbg.fallback import FallbackConfig
from quantdbg.pipeline import (
    AutoConfig,
    BiasCorrectionRepairConfig,
    CalibratorRepairConfig,
    EqualizeRepairConfig,
    SmoothQuantRepairConfig,
)
from quantdbg.pipeline.config import REPAIRS
from quantdbg.pipeline.records import ChannelRange, RepairRecord, SmoothingStep, TensorChoice
from quantdbg.sensitivity import SensitivityConfig


def _round_trip(value):  # noqa: ANN001, ANN202
    return type(value).from_dict(json.loads(json.dumps(value.to_dict())))


@pytest.mark.parametrize("config", [
    AutoConfig(),
    AutoConfig(CalibConfig(method=PercentileConfig(99.9), per_tensor={"a*": "mse"}),
               QuantConfig(exclude=("x",)), ("smoothquant",), CalibratorRepairConfig(0.01),
               SmoothQuantRepairConfig(SmoothingConfig(alpha=0.8), 4.0, 0.5),
               FallbackConfig(SensitivityConfig(mode="isolated"), precision=Precision.FP32,
                              max_evaluations=9),
               0.1, 8, 2, True, Path("run.partial")),
    AutoConfig(equalize=EqualizeRepairConfig(0.5), bias_correction=BiasCorrectionRepairConfig(0.25)),
    AutoConfig(equalize=EqualizeRepairConfig(min_sqnr_gain=None),
               bias_correction=BiasCorrectionRepairConfig(min_sqnr_gain=0.5, gate_samples=128)),
    CalibratorRepairConfig(),
    SmoothQuantRepairConfig(),
    EqualizeRepairConfig(),
    BiasCorrectionRepairConfig(),
])
def test_configs_round_trip(config):
    assert _round_trip(config) == config


def test_defaults():
    config = AutoConfig()
    assert config.repairs == REPAIRS == ("calibrator", "bias_correction", "equalize", "smoothquant")
    assert config.calib.method == "entropy" and config.fallback.precision is Precision.FP16
    assert config.max_fallback_share == 0.25 and config.resume_path is None


@pytest.mark.parametrize(("n_layers", "limit"), [(1, 1), (3, 1), (4, 1), (8, 2), (52, 13), (100, 25)])
def test_the_fallback_limit_is_a_share_of_the_layers_and_at_least_one(n_layers, limit):
    assert AutoConfig().fallback_limit(n_layers) == limit


def test_settings_leave_out_what_does_not_change_the_result():
    sensitivity = SensitivityConfig(progress=True, results_path=Path("r.json"))
    config = AutoConfig(progress=True, resume_path=Path("a.partial"), fallback=FallbackConfig(sensitivity))
    settings = config.settings()
    assert settings == AutoConfig() and settings.to_dict() == AutoConfig().to_dict()


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"repairs": "calibrator"}, "repairs takes a sequence of repair names, not one string; write "
                                "('calibrator',)."),
    ({"repairs": ("calibrator", "bias")}, "Unknown repair 'bias'; choose one of calibrator, bias_correction, "
                                          "equalize, smoothquant."),
    ({"repairs": ("calibrator", "calibrator")}, "repairs lists a repair twice: ('calibrator', "
                                                "'calibrator'); give "
                                                "each once, in the order to try them."),
    ({"max_fallback_share": 0.0}, "max_fallback_share must be in (0, 1], got 0.0."),
    ({"max_fallback_share": 1.5}, "max_fallback_share must be in (0, 1], got 1.5."),
    ({"batch_size": 0}, "batch_size must be >= 1 or None, got 0."),
    ({"threads": -1}, "threads must be >= 0 (0: all cores), got -1."),
])
def test_auto_config_refuses_bad_values(kwargs, message):
    with pytest.raises(ConfigError) as err:
        AutoConfig(**kwargs)
    assert str(err.value) == message


def test_repair_configs_refuse_bad_values():
    with pytest.raises(ConfigError) as err:
        CalibratorRepairConfig(-0.1)
    assert str(err.value) == ("CalibratorRepairConfig.min_improvement must be >= 0 (task-metric units), got "
                              "-0.1.")
    with pytest.raises(ConfigError) as err:
        SmoothQuantRepairConfig(min_outlier_ratio=0.5)
    assert str(err.value) == "SmoothQuantRepairConfig.min_outlier_ratio must be >= 1, got 0.5."
    with pytest.raises(ConfigError) as err:
        SmoothQuantRepairConfig(min_improvement=float("nan"))
    assert str(err.value) == ("SmoothQuantRepairConfig.min_improvement must be >= 0 (task-metric units), got "
                              "nan.")
    with pytest.raises(ConfigError) as err:
        EqualizeRepairConfig(min_sqnr_gain=float("inf"))
    assert str(err.value) == ("EqualizeRepairConfig.min_sqnr_gain must be a finite number of dB or None (no "
                              "gate), got inf.")
    with pytest.raises(ConfigError) as err:
        BiasCorrectionRepairConfig(gate_samples=0)
    assert str(err.value) == "BiasCorrectionRepairConfig.gate_samples must be >= 1, got 0."
    with pytest.raises(ConfigError) as err:
        CalibratorRepairConfig(start_sqnr_gain=float("nan"))
    assert str(err.value) == ("CalibratorRepairConfig.start_sqnr_gain must be a finite number of dB or None "
                              "(no gate), got nan.")
    with pytest.raises(ConfigError) as err:
        CalibratorRepairConfig(gate_samples=0)
    assert str(err.value) == "CalibratorRepairConfig.gate_samples must be >= 1, got 0."


def test_a_bad_field_in_json_is_named():
    data = AutoConfig().to_dict()
    data["repairs"] = ["calibrator", "pruning"]
    with pytest.raises(FormatError, match=r"field 'repairs\[1\]': expected one of \"calibrator\", "
                                          r"\"bias_correction\", \"equalize\", \"smoothquant\""):
        AutoConfig.from_dict(data)


def test_records_round_trip():
    choice = TensorChoice("x", "entropy", "minmax", 3.2, 40.0, 1.5, 30.2)
    assert choice.changed and not TensorChoice("y", "mse", "mse", 1.0, 1.0).changed
    ranges = ChannelRange("ln", np.array([1.0, 2.0, 40.0, 3.0]))
    step = SmoothingStep(SmoothingConfig(nodes=("q",)), (ranges,), (), {"ln": ranges.outlier_ratio})
    record = RepairRecord("smoothquant", True, False, 1.0, 0.5, "worse", (choice,), step)
    gated = RepairRecord("equalize", False, False, 1.0, None, "not evaluated",
                         output_sqnr=(28.2, float("inf")))
    assert "output_sqnr" not in record.to_dict() and gated.to_dict()["output_sqnr"] == [28.2, "inf"]
    for value in (choice, ranges, step, record, gated):
        assert _round_trip(value) == value
    assert record.changes == (choice,)
    assert step.absmax()["ln"].dtype == np.float64


def test_outlier_ratio_is_largest_over_median_channel():
    assert ChannelRange("t", np.array([1.0, 2.0, 3.0, 30.0, 2.0])).outlier_ratio == pytest.approx(15.0)
    assert ChannelRange("t", np.array([0.0, 0.0, 5.0])).outlier_ratio == float("inf")
    assert ChannelRange("t", np.zeros(3)).outlier_ratio == 1.0
