"""The INT8 start: the per-tensor calibrator choice replaces the default calibration before the first
evaluation when its outputs are clearly closer to FP32 (no task-metric evaluation spent on the default)."""
from __future__ import annotations

import json

import models_auto as ma
import numpy as np
import pytest

import quantdbg
from quantdbg.config import Precision
from quantdbg.errors import ConfigError
from quantdbg.fallback import FallbackConfig, FallbackTarget
from quantdbg.pipeline import AutoConfig, AutoRecipe, CalibratorRepairConfig
from quantdbg.report import render_markdown

FP32 = FallbackConfig(precision=Precision.FP32)
TARGET = FallbackTarget.min_sqnr(25)


@pytest.fixture(scope="module")
def clipped():
    """The clipped MLP (entropy clips the +-40 samples, minmax keeps them), run with the start gate on and
    with the calibrator choice as a repair only."""
    rng = np.random.default_rng(0)
    model, calib, evals = ma.clipped_mlp(), ma.clipped_inputs(rng), ma.clipped_inputs(rng)
    runs = {}
    for name, choice in (("start", CalibratorRepairConfig()), ("repair", ma.NO_START)):
        config = AutoConfig(threads=1, repairs=("calibrator", "smoothquant"), calibrator=choice,
                            fallback=FP32)
        runs[name] = quantdbg.auto(model, calib, evals, TARGET, config=config)
    return evals, runs


def _output_sqnr(model, evals, samples: int) -> float:  # noqa: ANN001
    import onnxruntime as ort
    feed = {"x": evals["x"][:samples]}
    ref = ort.InferenceSession(ma.clipped_mlp().SerializeToString()).run(None, feed)[0].astype(np.float64)
    out = ort.InferenceSession(model.SerializeToString()).run(None, feed)[0].astype(np.float64)
    return float(10 * np.log10((ref ** 2).sum() / ((out - ref) ** 2).sum()))


def test_a_clearly_closer_choice_is_the_start_and_saves_the_default_evaluation(clipped):
    evals, runs = clipped
    start, repair = runs["start"], runs["repair"]
    assert start.outcome == "repaired" and start.met and start.exclude == ()
    assert dict(start.evaluations) == {"reference": 1, "int8": 1}  # the default INT8 never evaluated
    assert dict(repair.evaluations) == {"reference": 1, "int8": 1, "calibrator": 1}
    # the same model either way: the start is the repair's model, one evaluation earlier
    assert start.model.model.SerializeToString() == repair.model.model.SerializeToString()
    assert start.int8_value == start.repaired_value == start.final_value == pytest.approx(repair.final_value)
    (record,) = start.repairs
    assert (record.repair, record.applied, record.kept, record.at_start) == ("calibrator", True, True, True)
    assert record.before == record.after == start.int8_value
    before, after = record.output_sqnr
    assert after - before > 1.0
    # the gate's numbers are the outputs' SQNR on the first 64 samples (an independent oracle for "after")
    assert after == pytest.approx(_output_sqnr(start.model.model, evals, 64), abs=1e-3)
    assert record.reason.startswith("chosen as the INT8 start before any evaluation")
    assert start.recipe.kept == ("calibrator",) and start.recipe.calib.per_tensor == {"x": "minmax"}
    assert "INT8 with the calibrator per tensor" in start.message and "default INT8" not in start.message
    assert "| INT8 start (calibrator per tensor) |" in render_markdown(start)
    again = AutoRecipe.from_dict(json.loads(json.dumps(start.recipe.to_dict())))
    assert again == start.recipe and again.repairs[0].at_start


def test_a_choice_not_clearly_closer_leaves_the_default_start(clipped):
    """A gain the choice does not reach: the default calibration is the start, the choice a repair."""
    _, runs = clipped
    rng = np.random.default_rng(0)
    model, calib, evals = ma.clipped_mlp(), ma.clipped_inputs(rng), ma.clipped_inputs(rng)
    config = AutoConfig(threads=1, repairs=("calibrator",), fallback=FP32,
                        calibrator=CalibratorRepairConfig(start_sqnr_gain=1000.0))
    result = quantdbg.auto(model, calib, evals, TARGET, config=config)
    assert dict(result.evaluations) == {"reference": 1, "int8": 1, "calibrator": 1}
    (record,) = result.repairs
    assert not record.at_start and record.kept and record.before == result.int8_value < 25.0
    assert result.int8_value == pytest.approx(runs["repair"].int8_value)
    assert "default INT8" in result.message


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"start_sqnr_gain": float("nan")},
     "CalibratorRepairConfig.start_sqnr_gain must be a finite number of dB or None (no gate), got nan."),
    ({"gate_samples": 0}, "CalibratorRepairConfig.gate_samples must be >= 1, got 0."),
])
def test_the_start_gate_settings_are_checked(kwargs, message):
    with pytest.raises(ConfigError) as err:
        CalibratorRepairConfig(**kwargs)
    assert str(err.value) == message
