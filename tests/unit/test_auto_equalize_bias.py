"""quantdbg.auto with cross-layer equalization and bias correction: each tried before any layer leaves INT8,
kept only when the task metric improves, recorded in the recipe (re-applied byte for byte) and the report."""
from __future__ import annotations

import models_repairs as mr
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from models_auto import NO_START

import quantdbg
from quantdbg.config import CalibConfig, Precision
from quantdbg.evaluation import OutputFunction
from quantdbg.fallback import FallbackConfig, FallbackTarget
from quantdbg.pipeline import AutoConfig, BiasCorrectionRepairConfig, EqualizeRepairConfig, apply_recipe
from quantdbg.report import render_markdown

FP32 = FallbackConfig(precision=Precision.FP32)


def _chain_feed(rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
    return {"x": rng.standard_normal((n, 3, 8, 8)).astype(np.float32),
            "z": rng.standard_normal((n, 16)).astype(np.float32)}


def _output_sqnr(name: str):  # noqa: ANN202
    def sqnr(out: dict[str, np.ndarray], ref: dict[str, np.ndarray]) -> float:
        noise = float(((out[name] - ref[name]).astype(np.float64) ** 2).sum())
        signal = float((ref[name].astype(np.float64) ** 2).sum())
        return 200.0 if noise == 0 else min(200.0, 10 * np.log10(signal / noise))  # FP32 vs itself: 200
    return OutputFunction(sqnr, f"{name} SQNR")


@pytest.fixture(scope="module")
def equalized():
    rng = np.random.default_rng(3)
    model, calib, evals = mr.conv_chain(0, spread=2.0), _chain_feed(rng, 32), _chain_feed(rng, 16)
    config = AutoConfig(CalibConfig("minmax"), repairs=("equalize", "calibrator"), threads=1, fallback=FP32,
                        calibrator=NO_START)  # the calibrator choice as a repair only, after equalization
    result = quantdbg.auto(model, calib, evals, FallbackTarget.min_metric(33.0), metric=_output_sqnr("y"),
                           config=config)
    return model, calib, evals, result


def test_equalization_repairs_unbalanced_channels_before_any_layer_leaves_int8(equalized):
    model, calib, _, result = equalized
    assert result.outcome == "repaired" and result.exclude == ()
    assert result.int8_value < 33.0 <= result.repaired_value
    record = result.repairs[0]
    assert (record.repair, record.applied, record.kept) == ("equalize", True, True)
    assert record.reason.startswith("equalized 4 pair(s) of layers (most unbalanced: ")
    assert result.recipe.kept == ("equalize",) and result.recipe.calib.equalize
    assert not result.recipe.calib.bias_correction
    assert dict(result.evaluations) == {"reference": 1, "int8": 1, "equalize": 1}
    again = apply_recipe(model, calib, result.recipe)
    assert again.model.SerializeToString() == result.model.model.SerializeToString()
    markdown = render_markdown(result)
    assert "| repaired (equalize) |" in markdown


def test_a_calibration_that_equalizes_already_leaves_nothing_to_repair(equalized):
    model, calib, evals, first = equalized
    config = AutoConfig(CalibConfig("minmax", equalize=True), repairs=("equalize",), threads=1, fallback=FP32)
    result = quantdbg.auto(model, calib, evals, FallbackTarget.min_metric(60.0), metric=_output_sqnr("y"),
                           config=config)
    # the equalized model from the start
    assert result.int8_value == pytest.approx(first.repaired_value, abs=1e-3)
    (record,) = result.repairs
    assert (record.applied, record.kept, record.reason) == (False, False, "the model is equalized already")


def _mean_error(out: dict[str, np.ndarray], ref: dict[str, np.ndarray]) -> float:
    """Minus the largest per-channel mean error of ``y``: a systematic shift, what bias correction removes."""
    return -float(np.abs((out["y"] - ref["y"]).astype(np.float64).mean(axis=(0, 2, 3))).max())


@pytest.fixture(scope="module")
def corrected():
    rng = np.random.default_rng(4)
    data = {"x": (rng.standard_normal((32, 3, 6, 6)) + 1.0).astype(np.float32),
            "z": (rng.standard_normal((32, 12)) + 0.5).astype(np.float32)}
    config = AutoConfig(CalibConfig("minmax"), repairs=("bias_correction", "calibrator"), threads=1,
                        fallback=FP32)
    result = quantdbg.auto(mr.shifted_layers(), data, data, FallbackTarget.min_metric(-0.01),
                           metric=OutputFunction(_mean_error, "mean error"), config=config)
    return data, result


def test_bias_correction_removes_the_planted_shift_and_is_recorded(corrected):
    data, result = corrected
    assert result.outcome == "repaired" and result.int8_value < -0.03 and result.repaired_value >= -0.01
    (record,) = result.repairs  # met after the first repair: the calibrator is not tried
    assert (record.repair, record.applied, record.kept) == ("bias_correction", True, True)
    assert record.reason.startswith("corrected the biases of 4 layer(s) (largest mean shift ")
    before, after = record.output_sqnr  # the gate: the corrected outputs are closer to FP32
    assert after > before
    assert record.reason.endswith("; 1 skipped (a MatMul without a bias Add (a new Add node would change the "
                                  f"graph TensorRT fuses)); output SQNR against FP32 on the first 64 samples "
                                  f"{before:.3g} -> {after:.3g} dB; task metric "
                                  f"{result.int8_value:.6g} -> {result.repaired_value:.6g}: kept")
    assert result.recipe.calib.bias_correction and result.recipe.kept == ("bias_correction",)
    assert dict(result.evaluations) == {"reference": 1, "int8": 1, "bias_correction": 1}
    assert result.model.calibration.bias_correction is not None
    again = apply_recipe(mr.shifted_layers(), data, result.recipe, batch_size=5)
    assert again.model.SerializeToString() == result.model.model.SerializeToString()


def _sqnr_oracle(model: onnx.ModelProto, ref: onnx.ModelProto, feed: dict[str, np.ndarray]) -> float:
    """The output SQNR (dB) of ``model`` against ``ref`` on ``feed``, Q/DQ as ONNX defines it (NumPy)."""
    options = ort.SessionOptions()
    options.add_session_config_entry("session.disable_quant_qdq", "1")
    run = [ort.InferenceSession(m.SerializeToString(), options, providers=["CPUExecutionProvider"])
           .run(None, feed)[0].astype(np.float64) for m in (model, ref)]
    return float(10 * np.log10((run[1] ** 2).sum() / ((run[0] - run[1]) ** 2).sum()))


def test_an_equalization_that_brings_the_outputs_no_closer_to_fp32_is_not_evaluated():
    """The ReLU6 chain's equalization widens the activation range its ceilings allow (6 / s per channel):
    the outputs' SQNR drops, so the gate spends no task-metric evaluation on it."""
    rng = np.random.default_rng(3)
    calib = {"x": rng.standard_normal((64, 3, 8, 8)).astype(np.float32)}
    evals = {"x": rng.standard_normal((96, 3, 8, 8)).astype(np.float32)}
    config = AutoConfig(CalibConfig("minmax"), repairs=("equalize",), threads=1, fallback=FP32)
    result = quantdbg.auto(mr.relu6_chain(), calib, evals, FallbackTarget.min_metric(60.0),
                           metric=_output_sqnr("y"), config=config)
    (record,) = result.repairs
    head = {"x": evals["x"][:64]}  # the first batches holding 64 samples (two of 32)
    plain = quantdbg.quantize(mr.relu6_chain(), calib, CalibConfig("minmax")).model
    equalized = quantdbg.quantize(mr.relu6_chain(), calib, CalibConfig("minmax", equalize=True)).model
    want = (_sqnr_oracle(plain, mr.relu6_chain(), head), _sqnr_oracle(equalized, mr.relu6_chain(), head))
    assert record.output_sqnr == pytest.approx(want, abs=1e-3) and want[1] < want[0]
    assert (record.applied, record.kept, record.after) == (False, False, None)
    assert record.reason.endswith(f"; not evaluated: output SQNR against FP32 on the first 64 samples "
                                  f"{want[0]:.3g} -> {want[1]:.3g} dB, a gain is needed")
    assert "equalize" not in result.evaluations and not result.recipe.calib.equalize  # never evaluated
    assert (result.evaluations["reference"], result.evaluations["int8"]) == (1, 1)


def test_corrections_that_move_the_outputs_away_from_fp32_are_not_evaluated():
    """Corrections measured on calibration data centred at +1 undo a shift the evaluation data (centred
    at -1) does not have: the outputs drift from FP32, and the gate spends no evaluation on them."""
    rng = np.random.default_rng(5)

    def data(n: int, mean: float) -> dict[str, np.ndarray]:
        return {"x": (rng.standard_normal((n, 3, 6, 6)) + mean).astype(np.float32),
                "z": (rng.standard_normal((n, 12)) + mean / 2).astype(np.float32)}

    config = AutoConfig(CalibConfig("minmax"), repairs=("bias_correction",), threads=1, fallback=FP32)
    result = quantdbg.auto(mr.shifted_layers(), data(32, 1.0), data(96, -1.0), FallbackTarget.min_sqnr(90),
                           config=config)
    (record,) = result.repairs
    before, after = record.output_sqnr
    assert after < before and (record.applied, record.kept) == (False, False)
    assert "not evaluated: output SQNR against FP32 on the first 64 samples" in record.reason
    assert "bias_correction" not in result.evaluations and not result.recipe.calib.bias_correction


def test_a_repair_that_does_not_improve_the_metric_is_not_kept():
    rng = np.random.default_rng(5)
    data = {"x": (rng.standard_normal((16, 3, 6, 6)) + 1.0).astype(np.float32),
            "z": (rng.standard_normal((16, 12)) + 0.5).astype(np.float32)}
    flat = OutputFunction(lambda out, ref: 0.5, "flat")
    ungated = (EqualizeRepairConfig(min_sqnr_gain=None), BiasCorrectionRepairConfig(min_sqnr_gain=None))
    config = AutoConfig(CalibConfig("minmax"), repairs=("equalize", "bias_correction"), threads=1,
                        fallback=FP32, equalize=ungated[0], bias_correction=ungated[1])
    result = quantdbg.auto(mr.shifted_layers(), data, data, FallbackTarget.min_metric(0.9), metric=flat,
                           config=config)
    assert [(r.repair, r.applied, r.kept) for r in result.repairs] == [("equalize", True, False),
                                                                     ("bias_correction", True, False)]
    assert all(r.output_sqnr is None for r in result.repairs)  # no gate: both evaluated
    assert not result.recipe.calib.equalize and not result.recipe.calib.bias_correction
    assert result.recipe.kept == ()


class _Killed(BaseException):
    """Stands for the process being killed while the metric runs."""


class _Counting:
    """:func:`_mean_error`, counting its calls, killed at call ``fail_at`` (None: never)."""

    def __init__(self, fail_at: int | None = None) -> None:
        self.fail_at = fail_at
        self.calls = 0

    def __call__(self, out: dict[str, np.ndarray], ref: dict[str, np.ndarray]) -> float:
        if self.calls == self.fail_at:
            raise _Killed
        self.calls += 1
        return _mean_error(out, ref)


def test_a_killed_run_resumes_with_the_stored_corrections(corrected, tmp_path, monkeypatch):
    data, fresh = corrected
    config = AutoConfig(CalibConfig("minmax"), repairs=("bias_correction", "calibrator"), threads=1,
                        fallback=FP32, resume_path=tmp_path / "run.partial")
    target = FallbackTarget.min_metric(-0.01)
    with pytest.raises(_Killed):  # reference and INT8 scored, killed while scoring the corrected model
        quantdbg.auto(mr.shifted_layers(), data, data, target,
                      metric=OutputFunction(_Counting(2), "mean error"), config=config)
    measured: list[int] = []
    real = quantdbg.pipeline.context.correct_biases
    monkeypatch.setattr("quantdbg.pipeline.context.correct_biases",
                        lambda *args, **kwargs: measured.append(1) or real(*args, **kwargs))
    counting = _Counting()
    resumed = quantdbg.auto(mr.shifted_layers(), data, data, target,
                            metric=OutputFunction(counting, "mean error"), config=config)
    assert measured == [] and counting.calls == 1  # the corrections come from the file; one evaluation left
    assert resumed.model.model.SerializeToString() == fresh.model.model.SerializeToString()
    assert dict(resumed.evaluations) == dict(fresh.evaluations)


def test_the_default_repairs_reach_bias_correction_when_the_calibrator_is_not_enough(corrected):
    data, focused = corrected
    config = AutoConfig(CalibConfig("minmax"), threads=1, fallback=FP32)
    result = quantdbg.auto(mr.shifted_layers(), data, data, FallbackTarget.min_metric(-0.01),
                           metric=OutputFunction(_mean_error, "mean error"), config=config)
    assert [r.repair for r in result.repairs][:2] == ["calibrator", "bias_correction"]
    assert result.outcome == "repaired" and "bias_correction" in result.recipe.kept
    assert result.recipe.calib.bias_correction and result.repaired_value >= -0.01
    assert result.evaluations["bias_correction"] == 1 and "equalize" not in result.evaluations
