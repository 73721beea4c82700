"""The INT8 start: the per-tensor calibrator choice replaces the default calibration before the first
evaluation when its outputs are clearly closer to FP32 (no task-metric evaluation spent on the default)."""
from __future__ import annotations

import json

import models_auto as ma
import numpy as np
import pytest

import quantdbg
from quantdbg.config import CalibConfig, Precision
from quantdbg.evaluation import OutputFunction
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


def _typical_sqnr(outputs: dict[str, np.ndarray], reference: dict[str, np.ndarray]) -> float:
    """Output SQNR (dB) on the rows whose reference output is not from an outlier sample (|y| < 10): a task
    metric the default calibration (entropy, clipping the +-40 inputs) wins and minmax loses."""
    ref, out = reference["y"].astype(np.float64), outputs["y"].astype(np.float64)
    rows = np.abs(ref).max(axis=1) < 10.0
    noise = float(((out[rows] - ref[rows]) ** 2).sum())
    return 200.0 if noise == 0 else float(10 * np.log10((ref[rows] ** 2).sum() / noise))  # FP32: 200


def test_a_start_that_misses_the_target_gives_the_default_calibration_back():
    """The start gate picks the choice (all outputs closer to FP32), the task metric prefers the default:
    the calibrator repair evaluates the default back, and it is kept."""
    rng = np.random.default_rng(0)
    model, calib, evals = ma.clipped_mlp(), ma.clipped_inputs(rng), ma.clipped_inputs(rng)
    metric = OutputFunction(_typical_sqnr, "typical SQNR")
    config = AutoConfig(threads=1, repairs=("calibrator",), fallback=FP32)
    met = quantdbg.auto(model, calib, evals, FallbackTarget.min_metric(0.0), metric=metric, config=config)
    assert met.repairs[0].at_start  # the start gate takes the choice: which tensors it changes
    default = quantdbg.quantize(model, calib, CalibConfig())
    chosen = quantdbg.quantize(model, calib, CalibConfig(per_tensor={c.tensor: c.calibrator
                                                                     for c in met.repairs[0].changes}))
    fp32 = _outputs(model, evals)
    scores = [metric.from_outputs(_outputs(q.model, evals), fp32) for q in (default, chosen)]
    assert scores[0] > scores[1] + 1.0  # the scenario: the default is better on the task metric
    target = FallbackTarget.min_metric(sum(scores) / 2)
    result = quantdbg.auto(model, calib, evals, target, metric=metric, config=config)
    assert result.outcome == "repaired" and result.met and result.exclude == ()
    assert dict(result.evaluations) == {"reference": 1, "int8": 1, "calibrator": 1}
    start, back = result.repairs
    assert (start.at_start, start.kept) == (True, False)  # the start's choice, given up
    assert (back.at_start, back.applied, back.kept) == (False, True, True)
    assert back.after == pytest.approx(scores[0], abs=1e-6)
    # the choice's ranges re-derived from the flow's histograms, not from a fresh calibration's
    assert back.before == pytest.approx(scores[1], abs=0.1) and back.before < target.threshold
    assert result.int8_value == back.before and result.final_value == back.after
    assert result.recipe.calib.per_tensor == {} and result.recipe.kept == ("calibrator",)
    assert ma.record_scales(result.model) == ma.record_scales(default)


def _outputs(model, evals) -> dict[str, np.ndarray]:  # noqa: ANN001
    import onnxruntime as ort
    return {"y": ort.InferenceSession(model.SerializeToString()).run(None, {"x": evals["x"]})[0]}

