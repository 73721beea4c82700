"""The repair passes on one stage: the calibrator each tensor gets (against the evidence and the
calibrators themselves), SmoothQuant where activations carry outlier channels (against NumPy's
per-channel ranges), and the context's calibration that keeps a histogram for every tensor."""
from __future__ import annotations

import glob

import models_auto as ma
import models_smoothing as msm
import numpy as np
import pytest

from quantdbg._journal import Journal
from quantdbg.calibration import SmoothingConfig, calibrate
from quantdbg.calibration.calibrators.base import get_calibrator
from quantdbg.config import CalibConfig, TensorKind
from quantdbg.data import ArrayData
from quantdbg.evaluation import OutputMetric
from quantdbg.model.load import as_loaded
from quantdbg.pipeline import AutoConfig, SmoothQuantRepairConfig
from quantdbg.pipeline.context import AutoContext
from quantdbg.pipeline.repairs import REPAIR_PASSES, CalibratorRepair, SmoothQuantRepair, with_per_tensor
from quantdbg.quant_math import nsr

ONE_THREAD = AutoConfig(threads=1)


def _context(calib: dict, evals: dict, config: AutoConfig = ONE_THREAD) -> AutoContext:
    metric = OutputMetric("sqnr")
    return AutoContext(ArrayData(calib), ArrayData(evals), metric, config, Journal(None, "auto", {}))


def test_the_context_keeps_a_histogram_for_every_tensor_in_at_most_two_passes(rng):
    calib = ma.clipped_inputs(rng)
    context = _context(calib, calib)
    stage = context.stage(as_loaded(ma.clipped_mlp()), CalibConfig("minmax"))
    assert all(s.hist is not None for s in stage.calibration.stats.values())
    plain = calibrate(ma.clipped_mlp(), calib, CalibConfig("minmax"))
    assert stage.calibration.ranges == plain.ranges  # the extra histograms change no range
    again = context.stage(stage.fp, CalibConfig("minmax"))  # the stored calibration, no new pass
    assert [r.scale for r in stage.qmodel.records] == [r.scale for r in again.qmodel.records]


def test_each_tensor_gets_the_calibrator_with_the_least_local_noise(rng):
    calib, evals = ma.clipped_inputs(rng), ma.clipped_inputs(rng)
    context = _context(calib, evals)
    stage = context.stage(as_loaded(ma.clipped_mlp()), CalibConfig("entropy"))
    proposal = CalibratorRepair(AutoConfig().calibrator).apply(stage, context)
    report = context.evidence(stage)  # the stored evidence the repair read
    assert context.last_report is None  # and no ranking
    noise: dict[str, dict[str, float]] = {}  # oracle: summed noise power of the layers reading each tensor
    for layer in report.layers:
        for inp in layer.inputs:
            if inp.kind is TensorKind.ACTIVATION:
                for name, sqnr in layer.evidence.calibrator_sqnr.items():
                    noise.setdefault(inp.tensor, {}).setdefault(name, 0.0)
                    noise[inp.tensor][name] += nsr(sqnr)
    best = {t: min(sorted(c), key=c.__getitem__) for t, c in noise.items()}
    assert {c.tensor: c.calibrator for c in proposal.calibrators} == best
    assert proposal.stage is not None and proposal.repair == "calibrator"
    for choice in proposal.calibrators:
        stats = stage.calibration.stats[choice.tensor]
        assert choice.amax == get_calibrator(choice.calibrator).compute(stats).amax
        assert choice.previous_amax == get_calibrator("entropy").compute(stats).amax
    changed = {c.tensor: c.calibrator for c in proposal.calibrators if c.changed}
    assert proposal.stage.calib_config.per_tensor == {glob.escape(t): m for t, m in changed.items()}
    fresh = calibrate(ma.clipped_mlp(), calib, proposal.stage.calib_config)  # a full pass: the same ranges
    assert proposal.stage.calibration.ranges == fresh.ranges
    assert proposal.reason.startswith(f"{len(changed)} of {len(best)} activation tensor(s) change "
                                      f"calibrator (")


def test_no_calibrator_proposal_when_every_tensor_has_its_best(rng):
    calib = ma.clipped_inputs(rng)
    context = _context(calib, calib)
    stage = context.stage(as_loaded(ma.clipped_mlp()), CalibConfig("entropy"))
    best = {c.tensor: c.calibrator for c in CalibratorRepair(AutoConfig().calibrator).apply(stage, context)
            .calibrators}
    tuned = context.stage(stage.fp, with_per_tensor(CalibConfig("entropy"), best))
    proposal = CalibratorRepair(AutoConfig().calibrator).apply(tuned, context)
    assert proposal.stage is None and not any(c.changed for c in proposal.calibrators)
    assert proposal.reason == (f"each of the {len(best)} activation tensor(s) with evidence already has the "
                               "calibrator with the best local output SQNR")
    record = proposal.record(12.5)
    assert (record.applied, record.kept, record.before, record.after) == (False, False, 12.5, None)


def test_smoothquant_smooths_the_readers_of_outlier_channels(rng):
    x = rng.standard_normal((16, 5, 8)).astype(np.float32)
    context = _context({"x": x}, {"x": x})
    stage = context.stage(as_loaded(msm.ln_ffn()), CalibConfig("minmax"))
    repair = SmoothQuantRepair(SmoothQuantRepairConfig(min_outlier_ratio=5.0))
    proposal = repair.apply(stage, context)
    ln = msm.ln_ffn_forward(x)["ln"]
    absmax = np.abs(ln).reshape(-1, 8).max(axis=0)  # oracle: NumPy's per-channel max|x|
    step = proposal.smoothing
    (measured,) = step.act_absmax
    assert measured.tensor == "ln" and np.allclose(measured.absmax, absmax, rtol=1e-5)
    assert step.outlier_ratio["ln"] == pytest.approx(absmax.max() / np.median(absmax), rel=1e-5)
    assert step.config.nodes == ("q", "k", "up") and [m.nodes for m in step.migrations] == [("q", "k", "up")]
    assert proposal.stage is not None and proposal.stage.smoothing is step
    assert {n.name for n in proposal.stage.fp.proto.graph.node} >= {"q", "k", "up", "down"}
    assert proposal.reason == (f"smoothed 3 node(s) reading 1 activation(s) with outlier channels (largest "
                               f"ratio {measured.outlier_ratio:.3g} for 'ln', alpha 0.5)")


def test_smoothquant_does_not_apply_without_outlier_channels(rng):
    x = rng.standard_normal((16, 5, 8)).astype(np.float32)
    context = _context({"x": x}, {"x": x})
    stage = context.stage(as_loaded(msm.ln_ffn()), CalibConfig("minmax"))
    proposal = SmoothQuantRepair(SmoothQuantRepairConfig(min_outlier_ratio=50.0)).apply(stage, context)
    ratio = proposal.smoothing.outlier_ratio
    peak = max(ratio, key=ratio.__getitem__)
    assert proposal.stage is None and peak == "ln"
    assert proposal.reason == ("no activation read by a MatMul/Gemm node has outlier channels (largest "
                               "channel "
                               f"max|x| / median channel: {ratio['ln']:.3g} for 'ln', below 50)")
    only_matmuls = SmoothQuantRepair(SmoothQuantRepairConfig(SmoothingConfig(op_types=("MatMul",))))
    cnn_context = _context(ma.cnn_inputs(rng), ma.cnn_inputs(rng))  # its one Gemm is not smoothed here
    cnn = cnn_context.stage(as_loaded(ma.planted_cnn()), CalibConfig("minmax"))
    found = only_matmuls.apply(cnn, cnn_context)
    assert found.stage is None
    assert found.reason == "no MatMul node reads an activation with an initializer weight"


def test_a_tensor_moved_behind_an_inserted_mul_keeps_its_calibrator(rng):
    x = rng.standard_normal((32, 8)).astype(np.float32)
    context = _context({"x": x}, {"x": x})
    stage = context.stage(as_loaded(msm.residual_gemm()), CalibConfig("entropy", per_tensor={"x": "minmax"}))
    proposal = SmoothQuantRepair(SmoothQuantRepairConfig(min_outlier_ratio=1.0)).apply(stage, context)
    moved = {m.tensor: m.smoothed_tensor for m in proposal.smoothing.migrations}
    assert moved["x"] == "x/smooth/output"
    config = proposal.stage.calib_config
    assert config.method_for("x/smooth/output") == "minmax"
    assert config.method_for("ln/smooth/output") == "entropy"
    assert proposal.stage.calibration.ranges["x/smooth/output"].method == "minmax"


def test_per_tensor_choices_come_first_and_replace_the_same_name():
    config = CalibConfig("entropy", per_tensor={"*": "percentile", "a[*]": "mse"})
    found = with_per_tensor(config, {"a*": "minmax", "b": "mse"})
    assert list(found.per_tensor.items()) == [("a[*]", "minmax"), ("b", "mse"), ("*", "percentile")]
    assert found.method_for("a*") == "minmax" and found.method_for("c") == "percentile"


def test_every_repair_has_a_pass():
    config = AutoConfig()
    assert {name: type(build(config)).__name__ for name, build in REPAIR_PASSES.items()} == {
        "calibrator": "CalibratorRepair", "bias_correction": "BiasCorrectionRepair",
        "equalize": "EqualizeRepair", "smoothquant": "SmoothQuantRepair"}
    assert all(build(config).name == name for name, build in REPAIR_PASSES.items())
