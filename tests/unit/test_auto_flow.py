"""quantdbg.auto end to end on small models: a calibrator repair that keeps every layer in INT8, a planted
layer only the fallback fixes, error spread over the model, an unreachable target, a killed run that
resumes."""
from __future__ import annotations

import hashlib
import json
from dataclasses import replace

import models_auto as ma
import models_sensitivity as ms
import numpy as np
import onnx
import pytest
from models_auto import NO_START
from tool_grammars import modelopt, run, trtexec, trtexec_shapes

import quantdbg
from quantdbg.config import Precision, TensorKind
from quantdbg.errors import ConfigError
from quantdbg.evaluation import Accuracy, ModelFunction, OutputFunction
from quantdbg.fallback import FallbackConfig, FallbackTarget
from quantdbg.pipeline import AutoConfig, AutoRecipe, read_recipe
from quantdbg.pipeline.build import MODEL_PLACEHOLDER

# The scenarios are planted for the calibrator choice and SmoothQuant (equalization and bias correction
# have their own flow tests in test_auto_equalize_bias.py); the calibrator choice as a repair (its start
# gate has its own tests in test_auto_start.py).
CONFIG = AutoConfig(threads=1, repairs=("calibrator", "smoothquant"), calibrator=NO_START,
                    fallback=FallbackConfig(precision=Precision.FP32))


def _dq_fed(model: onnx.ModelProto) -> dict[str, bool]:
    """Node name -> whether every float input it reads comes from a DequantizeLinear (weights included)."""
    producers = {out: node.op_type for node in model.graph.node for out in node.output}
    return {node.name: all(producers.get(t) == "DequantizeLinear" for t in node.input[:2])
            for node in model.graph.node if node.op_type in ("Conv", "Gemm", "MatMul")}


@pytest.fixture(scope="module")
def clipped():
    rng = np.random.default_rng(0)
    model, calib, evals = ma.clipped_mlp(), ma.clipped_inputs(rng), ma.clipped_inputs(rng)
    return model, calib, evals, quantdbg.auto(model, calib, evals, FallbackTarget.min_sqnr(25), config=CONFIG)


def test_the_calibrator_repair_keeps_every_layer_in_int8(clipped):
    _, calib, _, result = clipped
    assert result.outcome == "repaired" and result.met
    assert result.int8_value < 5.0 < 25.0 <= result.repaired_value == result.final_value
    assert result.exclude == () and result.plan.evaluations == () and result.recipe.kept == ("calibrator",)
    (record,) = result.repairs  # the target holds after the first repair: SmoothQuant is not tried
    assert record.applied and record.kept and (record.before, record.after) == (result.int8_value,
                                                                               result.repaired_value)
    choice = {c.tensor: c for c in record.calibrators}
    assert (choice["x"].previous, choice["x"].calibrator) == ("entropy", "minmax")
    assert choice["x"].previous_amax < 5.0  # entropy clipped the +-40 samples
    assert choice["x"].amax == pytest.approx(float(np.abs(calib["x"]).max()), rel=1e-6)
    assert choice["x"].sqnr > choice["x"].previous_sqnr
    assert result.recipe.calib.per_tensor == {"x": "minmax"} and result.recipe.calib.method == "entropy"
    x_pair = next(r for r in result.model.records if r.tensor == "x" and r.kind is TensorKind.ACTIVATION)
    assert x_pair.calibrator == "minmax"
    assert x_pair.scale[0] == pytest.approx(float(np.abs(calib["x"]).max()) / 127, rel=1e-6)
    assert result.model.excluded == () and all(_dq_fed(result.model.model).values())
    assert dict(result.evaluations) == {"reference": 1, "int8": 1, "calibrator": 1}
    assert result.report is None  # the repair read the evidence alone: no layer was ranked


def test_the_calibrator_repair_scores_no_layer_ranking(clipped):
    """The repair reads the calibrator evidence alone; ranking the layers is left to the fallback."""
    model, calib, evals, _ = clipped
    scored: list[int] = []

    def relative(outputs: dict[str, np.ndarray], reference: dict[str, np.ndarray]) -> float:
        scored.append(len(reference["y"]))
        return ma.relative_accuracy(outputs, reference)

    result = quantdbg.auto(model, calib, evals, FallbackTarget.min_metric(0.9),
                           metric=OutputFunction(relative, "relative accuracy"), config=CONFIG)
    assert result.outcome == "repaired" and result.int8_value < 0.9 <= result.repaired_value
    assert scored == [len(evals["x"])] * 3  # FP32, default INT8, repaired: no variant on the first samples
    assert dict(result.evaluations) == {"reference": 1, "int8": 1, "calibrator": 1}


def test_the_recipe_reapplied_to_a_reexport_gives_byte_identical_scales(clipped, tmp_path):
    model, calib, _, result = clipped
    reexport = ma.clipped_mlp()
    reexport.producer_name = "another exporter"
    path = result.write(tmp_path / "plan.json")
    recipe = read_recipe(path)
    assert recipe == result.recipe == AutoRecipe.from_dict(json.loads(json.dumps(result.recipe.to_dict())))
    again = quantdbg.pipeline.apply_recipe(reexport, calib, recipe, batch_size=7)
    assert ma.record_scales(again) == ma.record_scales(result.model)
    same = quantdbg.pipeline.apply_recipe(model, calib, path)
    assert same.model.SerializeToString() == result.model.model.SerializeToString()


@pytest.fixture(scope="module")
def planted():
    rng = np.random.default_rng(1)
    model, calib, evals = ma.planted_cnn(), ma.cnn_inputs(rng), ma.cnn_inputs(rng)
    return model, calib, evals, quantdbg.auto(model, calib, evals, FallbackTarget.min_sqnr(30), config=CONFIG)


def _profile(commands) -> dict[str, tuple[tuple[int, ...], ...]]:  # noqa: ANN001
    parsed = run(commands.trtexec, ["trtexec"], trtexec())
    shapes = [trtexec_shapes(getattr(parsed, f"{which}Shapes")) for which in ("min", "opt", "max")]
    return {name: tuple(found[name] for found in shapes) for name in shapes[0]}


def test_the_library_returns_the_plan_with_the_build_of_the_final_model(clipped, planted, tmp_path):
    """quantdbg.auto finishes the plan itself: what the CLI prints, a Python caller gets."""
    model, calib, evals, repaired = clipped
    (n, features), = {v.shape for v in evals.values()}
    # No search: a plan with no layer excluded still builds the INT8 model, at the placeholder path.
    assert repaired.plan.build is not None and repaired.plan.build.exclude == ()
    assert repaired.plan.mixed_path == MODEL_PLACEHOLDER and repaired.plan.commands.modelopt == ""
    assert _profile(repaired.plan.commands) == {"x": ((1, features), (32, features), (32, features))}
    # The fallback's plan builds the mixed model: its layer pinned in the weakly typed build.
    fallback = planted[3].plan.commands
    weak = run(fallback.trtexec_weakly_typed, ["trtexec"], trtexec())
    assert weak.layerPrecisions == f"{ma.PLANTED}:fp32" and weak.int8 and not weak.fp16
    # Files given as paths: ModelOpt's command reads them; the batch size sets the profile.
    onnx.save(model, str(tmp_path / "fp32.onnx"))
    np.savez(tmp_path / "calib.npz", **calib)
    result = quantdbg.auto(tmp_path / "fp32.onnx", tmp_path / "calib.npz", evals, FallbackTarget.min_sqnr(25),
                           config=replace(CONFIG, batch_size=24))
    commands = result.plan.commands
    assert _profile(commands) == {"x": ((1, features), (24, features), (24, features))} and n % 24 != 0
    mo = run(commands.modelopt, ["python", "-m", "modelopt.onnx.quantization"], modelopt())
    assert (mo.onnx_path, mo.calibration_data_path) == (str(tmp_path / "fp32.onnx"),
                                                        str(tmp_path / "calib.npz"))
    saved = result.located(tmp_path / "final.onnx").plan.commands
    assert run(saved.trtexec, ["trtexec"], trtexec()).saveEngine == str(tmp_path / "final.engine")
    assert _profile(saved) == _profile(commands)


def test_when_repair_is_not_enough_the_planted_layer_falls_back(planted):
    model, calib, _, result = planted
    assert result.outcome == "fallback" and result.met
    assert result.exclude == (ma.PLANTED,) and result.plan.exclude == (ma.PLANTED,)
    assert result.repaired_value < 30.0 <= result.final_value == result.plan.value
    assert result.report.ranking[0] == ma.PLANTED
    fed = _dq_fed(result.model.model)
    assert fed.pop(ma.PLANTED) is False and all(fed.values())  # only the planted layer left INT8
    calibrator, smoothquant = result.repairs
    assert calibrator.applied and not calibrator.kept and calibrator.after <= calibrator.before
    assert not smoothquant.applied and "no activation read by a MatMul/Gemm node has outlier channels" \
        in smoothquant.reason
    assert result.evaluations["search"] == result.plan.n_evaluations + 1  # + the search's verification
    again = quantdbg.pipeline.apply_recipe(model, calib, result.recipe)
    assert again.model.SerializeToString() == result.model.model.SerializeToString()
    assert again.excluded == (ma.PLANTED,) and again.excluded_precision is Precision.FP32


def test_accuracy_labels_are_cut_to_the_samples_the_ranking_scores():
    """The output-space ranking scores each variant on the first 64 samples: Accuracy's labels must
    follow (the ranking runs once the repaired INT8 misses the target)."""
    rng = np.random.default_rng(5)
    calib, evals = ma.cnn_inputs(rng), ma.cnn_inputs(rng, 160)
    model, labels = ma.planted_classifier(evals)
    result = quantdbg.auto(model, calib, evals, FallbackTarget.max_relative_loss(5), metric=Accuracy(labels),
                           config=CONFIG)
    assert result.fp32_value == 1.0 and result.repaired_value < 0.95
    assert result.outcome == "fallback" and result.exclude == (ma.PLANTED,) and result.final_value >= 0.95
    space = result.report.output_space
    assert (space.metric, space.n_samples) == ("accuracy", 64)
    assert all(float(v * 64).is_integer() for v in space.values.values())  # scored against 64 labels
    assert space.ranking[0] == ma.PLANTED


def test_error_spread_over_the_model_stops_within_the_limit_and_says_so(rng):
    evals = ma.cnn_inputs(rng)
    calib = ma.cnn_inputs(rng)
    result = quantdbg.auto(ms.small_cnn(), calib, evals, FallbackTarget.min_sqnr(42), config=CONFIG)
    plan = result.plan
    assert result.outcome == "spread" and not result.met
    assert result.target.is_met(plan.value)  # the search's set meets the target, verified ...
    assert len(plan.exclude) > result.max_fallback == 1  # ... but holds more than 25 % of the 4 layers
    assert len(result.exclude) <= 1 and len(result.model.excluded) == len(result.exclude)
    k = len(result.exclude)
    repaired = f", repaired {result.repaired_value:.4g}" if result.recipe.kept else ""
    assert result.message == (
        f"Missed output SQNR >= 42 dB: no small set of layers meets it, the error is spread over the model: "
        f"the search needed {len(plan.exclude)} of 4 layers out of INT8 (sqnr {plan.value:.4g}), more than "
        f"the limit of 1 (25 %). Stopped at the best set within the limit of 1: {k} of 4 layers ({25 * k} %) "
        f"out of INT8 in fp32, sqnr {result.final_value:.4g} (FP32 inf, default INT8 "
        f"{result.int8_value:.4g}{repaired}).")
    assert result.final_value >= result.repaired_value


def test_an_unreachable_target_names_the_numbers(tmp_path):
    rng = np.random.default_rng(2)
    model, data = ms.mlp4(), {"x": rng.standard_normal((16, 16)).astype(np.float32)}
    metric = ModelFunction(lambda path: 0.25, name="score")
    result = quantdbg.auto(model, data, data, FallbackTarget.min_metric(0.5), metric=metric, config=CONFIG)
    plan = result.plan
    assert result.outcome == "unreachable" and plan.status == "unreachable" and result.exclude == ()
    assert [r.kept for r in result.repairs] == [False, False]  # an equal metric is no improvement
    best = next(e for e in plan.evaluations if e.purpose != "verify")
    assert result.message == (
        f"Missed metric >= 0.5: no set of layers the search tried meets it ({plan.n_evaluations} "
        f"evaluations; "
        f"the best, {len(best.exclude)} layer(s) out of INT8, gives score 0.25). Stopped at the best set "
        "within the limit of 1: 0 of 4 layers (0 %) out of INT8 in fp32, score 0.25 (FP32 0.25, default "
        "INT8 0.25).")


class Killed(BaseException):
    """Stands for the process being killed while the metric runs (like KeyboardInterrupt, no Exception)."""


class Recorder:
    """A task metric (relative accuracy) that records a digest of every evaluation it makes and
    raises :class:`Killed` instead of the evaluation after ``fail_after`` of them."""

    def __init__(self, fail_after: int | None = None) -> None:
        self.fail_after = fail_after
        self.seen: list[str] = []

    def __call__(self, outputs, reference) -> float:  # noqa: ANN001
        if self.fail_after is not None and len(self.seen) == self.fail_after:
            raise Killed
        digest = hashlib.sha256()
        for name in sorted(outputs):
            digest.update(np.ascontiguousarray(outputs[name]).tobytes())
        self.seen.append(digest.hexdigest())
        return ma.relative_accuracy(outputs, reference)


def test_a_killed_run_resumes_and_makes_no_evaluation_twice(planted, tmp_path):
    model, calib, evals, _ = planted
    target = FallbackTarget.min_metric(0.97)
    resume = replace(CONFIG, resume_path=tmp_path / "run.partial")
    whole, first, second = Recorder(), Recorder(fail_after=4), Recorder()
    fresh = quantdbg.auto(model, calib, evals, target, metric=OutputFunction(whole, "rel"), config=CONFIG)
    assert fresh.exclude == (ma.PLANTED,) and len(whole.seen) > 4
    with pytest.raises(Killed):
        quantdbg.auto(model, calib, evals, target, metric=OutputFunction(first, "rel"), config=resume)
    assert (tmp_path / "run.partial").is_file() and len(first.seen) == 4
    resumed = quantdbg.auto(model, calib, evals, target, metric=OutputFunction(second, "rel"), config=resume)
    assert first.seen + second.seen == whole.seen  # the remaining evaluations, each once, in order
    assert (resumed.exclude, resumed.final_value, dict(resumed.evaluations)) == \
        (fresh.exclude, fresh.final_value, dict(fresh.evaluations))
    again = Recorder()
    quantdbg.auto(model, calib, evals, target, metric=OutputFunction(again, "rel"), config=resume)
    assert again.seen == []  # a finished run's file answers every evaluation
    with pytest.raises(ConfigError) as err:
        quantdbg.auto(model, calib, evals, FallbackTarget.min_metric(0.9),
                      metric=OutputFunction(again, "rel"), config=resume)
    assert str(err.value) == (f"Resume file {str(tmp_path / 'run.partial')!r} belongs to another run: the "
                              "target changed; pass --restart to start over (or delete the file).")


def test_target_and_metric_must_agree(clipped):
    model, calib, evals, _ = clipped
    with pytest.raises(ConfigError) as err:
        quantdbg.auto(model, calib, evals, FallbackTarget.min_sqnr(20), metric="cosine", config=CONFIG)
    assert str(err.value) == ("An SQNR target judges the output SQNR, but the metric is 'cosine'; leave "
                              "metric='sqnr', or give a metric target (FallbackTarget.min_metric or "
                              "max_relative_loss).")
    with pytest.raises(ConfigError) as err:
        quantdbg.auto(model, calib, evals, FallbackTarget.max_relative_loss(1), metric="rel_l2",
                      config=CONFIG)
    assert str(err.value) == ("The target says higher is better but metric 'rel_l2' is lower-is-better; make "
                              "them agree.")
    with pytest.raises(ConfigError) as err:
        quantdbg.auto(model, calib, evals, FallbackTarget.max_relative_loss(1), config=CONFIG)
    assert str(err.value) == ("A relative-loss target needs a finite FP32 metric, but sqnr of the FP32 model "
                              "is inf; give an absolute bound instead (FallbackTarget.min_metric, "
                              "--min-metric).")


def test_quantdbg_auto_is_the_pipeline_function():
    from quantdbg import pipeline

    assert quantdbg.auto is pipeline.auto and "auto" in quantdbg.__all__
    assert quantdbg.AutoConfig is pipeline.AutoConfig and quantdbg.AutoResult is pipeline.AutoResult
    assert pipeline.apply_recipe.__module__ == "quantdbg.pipeline.recipe"
