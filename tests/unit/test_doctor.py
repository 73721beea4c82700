"""The doctor: each check fires on a model built to trigger it and stays quiet where it must not,
judged against hand-computed values; the registry, the report and its JSON."""
from __future__ import annotations

import json
import math

import models
import models_doctor
import numpy as np
import pytest

from quantdbg.calibration import CalibrationResult, CollectConfig, TensorRange, collect_stats
from quantdbg.calibration.calibrators.base import get_calibrator
from quantdbg.calibration.compare import histogram_sqnr
from quantdbg.calibration.stats import Collector
from quantdbg.config import CalibConfig, QuantConfig
from quantdbg.diagnostics import CHECKS, DoctorConfig, DoctorReport, Evidence, Finding, Severity, diagnose
from quantdbg.diagnostics.checks.base import CheckOutcome
from quantdbg.diagnostics.checks.calibration_size import (
    ChunkedStats,
    ScaleStability,
    bootstrap_stability,
    check_calibration_size,
    collect_chunked,
)
from quantdbg.diagnostics.checks.calibrator_disagreement import check_calibrator_disagreement
from quantdbg.diagnostics.checks.mixed_ranges import MixedRange, check_mixed_ranges, mixed_ranges
from quantdbg.diagnostics.checks.qdq_fusion import check_qdq_fusion
from quantdbg.diagnostics.checks.registry import CHECK_REGISTRY
from quantdbg.diagnostics.checks.sensitive_layers import (
    Confirmation,
    LayerConfirmation,
    check_sensitive_layers,
    confirm_layers,
)
from quantdbg.diagnostics.checks.weight_zeroing import check_weight_zeroing, weight_zeroing
from quantdbg.diagnostics.doctor import CheckRun, format_text, sort_findings
from quantdbg.diagnostics.findings import NO_EVIDENCE
from quantdbg.errors import ConfigError, FormatError
from quantdbg.model import load_model
from quantdbg.qdq import quantize


def _stats(name: str, values: np.ndarray, num_bins: int = 2048):
    collector = Collector([name], True, num_bins)
    collector.update(name, values.astype(np.float32))
    return collector.result()[name]


def _calibration(stats, method: str) -> CalibrationResult:
    ranges = {name: get_calibrator(method).compute(s) for name, s in stats.items()}
    return CalibrationResult(ranges, stats, CalibConfig(method=method), 1, 1)


# ----- weights zeroed -------------------------------------------------------------------------

def test_weight_zeroing_matches_numpy_and_fires_for_per_tensor_scales(rng):
    model = models_doctor.outlier_channel_conv()
    x = {"x": rng.standard_normal((8, 3, 8, 8), dtype=np.float32)}
    qmodel = quantize(model, x, quant=QuantConfig(per_channel=False))
    w = onnx_weight(model, "conv.w").astype(np.float64)
    per_tensor = np.round(w / (np.abs(w).max() / 127)) == 0
    channel_scale = np.abs(w).reshape(4, -1).max(axis=1).reshape(4, 1, 1, 1) / 127
    per_channel = np.round(w / channel_scale) == 0
    [item] = weight_zeroing(load_model(model), qmodel)
    assert item.scheme == "per-tensor"
    assert item.per_tensor == pytest.approx(per_tensor.mean())
    assert item.per_channel == pytest.approx(per_channel.mean())
    assert item.per_tensor > 0.5 > item.per_channel
    [finding] = check_weight_zeroing(load_model(model), qmodel, 0.05).findings
    assert finding.severity == "high" and finding.subjects == ("conv",)
    assert finding.evidence.rows[0][3] == pytest.approx(100 * per_tensor.mean())  # in %


def test_weight_zeroing_with_per_channel_scales_is_only_informative(rng):
    model = models_doctor.outlier_channel_conv()
    qmodel = quantize(model, {"x": rng.standard_normal((8, 3, 8, 8), dtype=np.float32)})
    [finding] = check_weight_zeroing(load_model(model), qmodel, 0.05).findings
    assert finding.severity == "info"
    assert "per-channel scales in use keep them" in finding.title


def test_weight_zeroing_quiet_on_ordinary_weights(rng):
    model = models.conv_relu(channels=16)
    qmodel = quantize(model, {"x": rng.standard_normal((8, 3, 8, 8), dtype=np.float32)},
                      quant=QuantConfig(per_channel=False))
    outcome = check_weight_zeroing(load_model(model), qmodel, 0.05)
    assert outcome.findings == ()
    assert len(outcome.data) == 1


def onnx_weight(model, name):
    from onnx import numpy_helper

    return next(numpy_helper.to_array(i) for i in model.graph.initializer if i.name == name)


# ----- calibrators disagreeing ----------------------------------------------------------------

def _fake_quant_sqnr(x: np.ndarray, amax: float) -> float:
    step = amax / 127
    q = np.clip(np.round(x / step), -127, 127) * step
    return 10 * math.log10((x.astype(np.float64) ** 2).sum() / ((x - q) ** 2).sum())


@pytest.mark.parametrize("amax", [0.5, 2.0, 4.0, 40.0])
def test_histogram_sqnr_matches_quantizing_the_samples(rng, amax):
    x = rng.standard_normal(200_000).astype(np.float32)
    stats = _stats("t", x)
    assert histogram_sqnr(stats, amax) == pytest.approx(_fake_quant_sqnr(x, amax), abs=0.3)


def test_calibrator_disagreement_fires_on_an_outlier_and_names_a_better_calibrator(rng):
    x = np.concatenate([rng.standard_normal(1_000_000), [100.0]]).astype(np.float32)
    calibration = _calibration({"t": _stats("t", x)}, "minmax")
    outcome = check_calibrator_disagreement(calibration, ratio=2.0)
    [finding] = outcome.findings
    [item] = outcome.data
    assert item.ratio > 2 and item.chosen == "minmax" and item.best != "minmax"
    assert item.tensor_sqnr[item.best] - item.tensor_sqnr["minmax"] >= 6
    assert finding.severity == "high" and finding.subjects == ("t",)
    assert f"'t': {item.best!r}" in finding.fix


def test_calibrator_disagreement_quiet_on_bounded_data(rng):
    x = rng.uniform(-1, 1, 100_000).astype(np.float32)
    outcome = check_calibrator_disagreement(_calibration({"t": _stats("t", x)}, "entropy"), ratio=2.0)
    assert outcome.findings == ()
    assert outcome.data[0].ratio < 2


# ----- calibration-set size -------------------------------------------------------------------

def _chunked(rng, draw, chunks: int = 8, per_chunk: int = 64) -> ChunkedStats:
    stats = []
    for _ in range(chunks):
        collector = Collector(["t"], True, 128)
        collector.update("t", draw(rng, per_chunk).astype(np.float32))
        stats.append(collector.result())
    return ChunkedStats(tuple(stats), (per_chunk,) * chunks)


def test_calibration_size_fires_for_heavy_tailed_minmax(rng):
    chunked = _chunked(rng, lambda r, n: r.standard_cauchy(n))
    items = bootstrap_stability(chunked, {"t": get_calibrator("minmax")}, rounds=16, tolerance=0.05)
    [item] = items
    assert item.n_samples == (64, 128, 256, 512) and not item.stable
    merged_amax = max(max(abs(s["t"].min), abs(s["t"].max)) for s in chunked.chunks)
    assert item.scale == pytest.approx(np.float32(merged_amax / 127), rel=1e-6)
    [finding] = check_calibration_size(items, 512).findings
    assert finding.subjects == ("t",) and "512 calibration samples" in finding.title


def test_calibration_size_quiet_when_the_range_is_bounded(rng):
    chunked = _chunked(rng, lambda r, n: r.uniform(-1, 1, n))
    items = bootstrap_stability(chunked, {"t": get_calibrator("minmax")}, rounds=16, tolerance=0.05)
    assert items[0].stable
    assert check_calibration_size(items, 512).findings == ()


def test_collect_chunked_interleaves_samples_and_merges_to_the_full_statistics(rng):
    model = load_model(models.conv_relu())
    x = rng.standard_normal((21, 3, 8, 8), dtype=np.float32)
    feeds = [{"x": x[i:i + 5]} for i in range(0, 21, 5)]  # batches straddle chunk boundaries
    entropy = get_calibrator("entropy")  # needs a histogram
    chunked = collect_chunked(model, feeds, {"conv_out": entropy}, chunks=4, num_bins=128, threads=1)
    assert chunked.sizes == (6, 5, 5, 5)
    with_hist = CollectConfig(histogram=True, num_bins=128)
    per_chunk = [collect_stats(model, {"x": x[k::4]}, ["conv_out"], with_hist)["conv_out"]
                 for k in range(4)]
    for got, want in zip(chunked.chunks, per_chunk, strict=True):
        assert got["conv_out"].count == want.count
        assert np.array_equal(got["conv_out"].hist, want.hist)


# ----- mixed value ranges ---------------------------------------------------------------------

def test_mixed_ranges_fires_on_boxes_next_to_scores(rng):
    model = load_model(models_doctor.detection_head())
    x = models_doctor.positive_inputs(rng, (64, 8))
    [by_axis] = [m for m in mixed_ranges(model, [{"x": x}], {}, ["y"], 0.5, threads=1)]
    y = np.maximum(x @ onnx_weight(model, "head.w").T, 0).astype(np.float64)
    scale = np.abs(y).max() / 127
    zeroed = ((np.round(y / scale) == 0) & (y != 0)).sum(axis=0) / (y != 0).sum(axis=0)
    assert by_axis.swamped == (4, 5)
    np.testing.assert_allclose(by_axis.channel_zeroed, zeroed, atol=1e-12)
    [finding] = check_mixed_ranges([by_axis], 25.0).findings
    assert finding.severity == "high" and finding.subjects == ("y",)
    assert by_axis.sqnr_db >= 25 > by_axis.swamped_sqnr_db


def test_mixed_ranges_quiet_when_every_channel_shares_a_range(rng):
    model = load_model(models_doctor.detection_head(box_scale=1.0, score_scale=1.0))
    items = mixed_ranges(model, [{"x": models_doctor.positive_inputs(rng, (64, 8))}], {}, ["y"], 0.5, 1)
    assert items[0].swamped == ()
    assert check_mixed_ranges(items).findings == ()


def test_mixed_ranges_quiet_on_a_softmax_whose_channels_share_one_range(rng):
    model = load_model(models_doctor.softmax_head())
    x = (rng.standard_normal((256, 16)) * 6).astype(np.float32)
    [item] = mixed_ranges(model, [{"x": x}], {}, ["y"], 0.5, threads=1)
    assert max(item.channel_zeroed) > 0.5  # most probabilities round to 0 ...
    assert item.swamped == ()  # ... yet no channel lives in a smaller range
    assert check_mixed_ranges([item]).findings == ()


def test_mixed_ranges_ignores_dead_channels(rng):
    model = load_model(models_doctor.detection_head(score_scale=1e-30))
    [item] = mixed_ranges(model, [{"x": models_doctor.positive_inputs(rng, (64, 8))}], {}, ["y"], 0.5, 1)
    assert max(item.channel_absmax[4:]) < 1e-28 and item.swamped == ()


# ----- sensitive layers -----------------------------------------------------------------------

def _doctored_mlp(rng):
    """The MLP with fc2's activation range set 100x too wide: fc2's input loses its resolution."""
    model = load_model(models.mlp())
    data = {"x": rng.standard_normal((64, 8), dtype=np.float32)}
    honest = quantize(model, data, CalibConfig(method="minmax"))
    ranges = dict(honest.calibration.ranges)
    r = ranges["r"]
    ranges["r"] = TensorRange("r", r.lo * 100, r.hi * 100, r.method)
    bad = CalibrationResult(ranges, honest.calibration.stats, honest.calibration.config, 1, 64)
    from quantdbg.qdq import insert_qdq

    return model, insert_qdq(model, bad), data


def test_sensitive_layers_confirms_the_doctored_layer_in_isolation(rng):
    from quantdbg.backends import OnnxrtRunnerFactory, OrtConfig
    from quantdbg.sensitivity import SensitivityConfig, VariantEvaluator, analyze_sensitivity

    model, qmodel, data = _doctored_mlp(rng)
    factory = OnnxrtRunnerFactory(OrtConfig(intra_op_num_threads=1))
    ranking = analyze_sensitivity(model, qmodel, data, SensitivityConfig(evidence=False),
                                  runner_factory=factory)
    with VariantEvaluator(model, qmodel, data, "sqnr", factory) as evaluator:
        confirmation = confirm_layers(evaluator, ranking, top=2)
    assert confirmation.layers[0].node == "fc2"
    assert confirmation.layers[0].isolated_sqnr_db < confirmation.layers[1].isolated_sqnr_db
    [finding] = check_sensitive_layers(confirmation, max_sqnr_db=30).findings
    assert finding.subjects[0] == "fc2"


def _confirmation(*rows: tuple[str, float, float]) -> Confirmation:
    layers = tuple(LayerConfirmation(n, "Conv", i + 1, 40.0, sqnr, sqnr, share)
                   for i, (n, sqnr, share) in enumerate(rows))
    return Confirmation(30.0, layers)


def test_sensitive_layers_judge_thresholds():
    quiet = _confirmation(("a", 45.0, 0.1), ("b", 48.0, 0.05))
    assert check_sensitive_layers(quiet, 30.0, 0.5).findings == ()
    dominant = check_sensitive_layers(_confirmation(("a", 35.0, 0.8)), 30.0, 0.5).findings
    assert [f.severity for f in dominant] == ["low"]
    severe = check_sensitive_layers(_confirmation(("a", 12.0, 3.0), ("b", 45.0, 0.1)), 30.0, 0.5).findings
    assert severe[0].severity == "high" and severe[0].subjects == ("a",)


# ----- TensorRT lint ----------------------------------------------------------------------------

def test_qdq_fusion_reports_per_tensor_weights_and_is_quiet_on_a_clean_model(rng):
    x = {"x": rng.standard_normal((8, 3, 8, 8), dtype=np.float32)}
    clean = quantize(models.conv_relu(channels=16), x)
    assert check_qdq_fusion(clean.model).findings == ()
    per_tensor = quantize(models.conv_relu(channels=16), x, quant=QuantConfig(per_channel=False))
    [finding] = check_qdq_fusion(per_tensor.model).findings
    assert finding.severity == "medium" and "per-tensor-weight" in finding.title
    assert finding.subjects == ("conv",)


# ----- ordering, report, config -----------------------------------------------------------------

def test_findings_sort_most_serious_first():
    def mk(check, severity, score):
        return Finding(check, Severity(severity), score, f"{check}-{severity}", (), Evidence(("a",)), "")
    found = sort_findings([mk("qdq_fusion", "info", 9), mk("weight_zeroing", "medium", 1),
                           mk("mixed_ranges", "high", 0.1), mk("calibration_size", "medium", 5),
                           mk("sensitive_layers", "medium", math.inf), mk("weight_zeroing", "low", math.nan)])
    assert [f.title for f in found] == ["mixed_ranges-high", "sensitive_layers-medium",
                                        "calibration_size-medium", "weight_zeroing-medium",
                                        "weight_zeroing-low", "qdq_fusion-info"]


def test_diagnose_end_to_end_round_trips_and_prints_every_finding(rng):
    model = models_doctor.outlier_channel_conv()
    data = {"x": rng.standard_normal((32, 3, 8, 8), dtype=np.float32)}
    config = DoctorConfig(CalibConfig(), QuantConfig(per_channel=False),
                          threads=1, bootstrap_rounds=4, bootstrap_chunks=4, batch_size=8)
    report = diagnose(model, data, config=config)
    assert [r.check for r in report.runs] == list(CHECKS)
    assert all(r.status in ("fired", "clear") for r in report.runs)
    assert report.findings == sort_findings(report.findings)
    assert {"weight_zeroing", "qdq_fusion"} <= {f.check for f in report.findings}
    again = DoctorReport.from_dict(json.loads(json.dumps(report.to_dict())))
    assert again.to_dict() == report.to_dict()
    text = format_text(report)
    for finding in report.findings:
        assert finding.title in text


def test_diagnose_compares_calibrators_even_when_minmax_collected_no_histogram(rng):
    data = {"x": rng.standard_normal((16, 3, 8, 8), dtype=np.float32)}
    config = DoctorConfig(CalibConfig(method="minmax"), checks=("calibrator_disagreement",), threads=1)
    report = diagnose(models.conv_relu(), data, config=config)
    [item] = report.calibrators
    assert item.chosen == "minmax" and {"entropy", "percentile", "mse", "minmax"} <= set(item.amax)
    assert item.amax["minmax"] == pytest.approx(float(np.abs(data["x"]).max()))


def test_diagnose_skips_checks_not_requested(rng):
    data = {"x": rng.standard_normal((8, 3, 8, 8), dtype=np.float32)}
    report = diagnose(models.conv_relu(), data, config=DoctorConfig(checks=("weight_zeroing",), threads=1))
    assert {r.check: r.status for r in report.runs}["mixed_ranges"] == "skipped"
    assert report.sensitivity is None and report.stability == ()


def test_doctor_config_rejects_bad_values():
    with pytest.raises(ConfigError, match="No doctor check named 'weights_zeroing'.*'weight_zeroing'"):
        DoctorConfig(checks=("weights_zeroing",))
    with pytest.raises(ConfigError, match="bootstrap_chunks must be >= 2, got 1"):
        DoctorConfig(bootstrap_chunks=1)
    with pytest.raises(ConfigError, match="disagreement_ratio must be > 1"):
        DoctorConfig(disagreement_ratio=1.0)
    config = DoctorConfig(CalibConfig(method="percentile"), QuantConfig(exclude=("fc1",)), threads=1)
    assert DoctorConfig.from_dict(json.loads(json.dumps(config.to_dict()))) == config


def test_check_run_and_report_reject_other_json():
    run = CheckRun("mixed_ranges", "failed", "x", 1.0)
    assert CheckRun.from_dict(json.loads(json.dumps(run.to_dict()))) == run
    with pytest.raises(FormatError, match="format is 'quantdbg.sensitivity/1', expected 'quantdbg.doctor/1'"):
        DoctorReport.from_dict({"format": "quantdbg.sensitivity/1"})
    with pytest.raises(FormatError, match="field 'status': expected one of"):
        CheckRun.from_dict({"check": "mixed_ranges", "status": "exploded"})


# ----- hand-computed judgements -----------------------------------------------------------------

def _two_channel_weight(second: list[float]) -> np.ndarray:
    """Channel 0 sets the per-tensor scale to exactly 1 (max |w| = 127); channel 1 is ``second``."""
    return np.array([[127.0, 1.0, 1.0, 1.0], second], np.float32).reshape(2, 1, 2, 2)


@pytest.mark.parametrize("second, zeroed, severity", [
    ([0.4, 0.4, 0.6, 0.2], 3 / 8, Severity.HIGH),    # 0.4, 0.4, 0.2 round to 0: 3 of 8 non-zero weights
    ([0.4, 0.6, 0.6, 0.6], 1 / 8, Severity.MEDIUM),  # one of 8: above 5 %, below 20 %
])
def test_weight_zeroing_per_tensor_by_hand(rng, second, zeroed, severity):
    model = models_doctor.conv_with_weights(_two_channel_weight(second))
    x = {"x": rng.standard_normal((4, 1, 4, 4), dtype=np.float32)}
    qmodel = quantize(model, x, quant=QuantConfig(per_channel=False))
    [item] = weight_zeroing(load_model(model), qmodel)
    assert (item.node, item.tensor, item.nonzero, item.scheme) == ("conv", "conv.w", 8, "per-tensor")
    assert item.per_tensor == zeroed and item.per_channel == 0.0  # per channel, channel 1's scale is its own
    [finding] = check_weight_zeroing(load_model(model), qmodel, 0.05).findings
    assert (finding.check, finding.severity, finding.score, finding.subjects) == (
        "weight_zeroing", severity, zeroed, ("conv",))
    assert finding.evidence.rows == (("conv", "Conv", 8, 100 * zeroed, 0.0, "per-tensor"),)
    assert check_weight_zeroing(load_model(model), qmodel, zeroed).findings == ()  # "above", not "at"


def test_weight_zeroing_per_channel_scales_give_only_the_info_finding(rng):
    model = models_doctor.conv_with_weights(_two_channel_weight([0.4, 0.4, 0.6, 0.2]))
    qmodel = quantize(model, {"x": rng.standard_normal((4, 1, 4, 4), dtype=np.float32)})
    [finding] = check_weight_zeroing(load_model(model), qmodel, 0.05).findings
    assert (finding.severity, finding.score) == (Severity.INFO, 3 / 8)
    assert finding.evidence.rows == (("conv", "Conv", 8, 100 * 3 / 8, 0.0, "per-channel"),)
    assert check_weight_zeroing(load_model(model), qmodel, 0.5).findings == ()  # per-tensor 37.5 % < 50 %


def _mixed(tensor="y", role="output", swamped=(1, 2), sqnr=40.0) -> MixedRange:
    return MixedRange(tensor, role, 1, 0.5, (100.0, 2.0, 1.0), (0.0, 0.8, 0.9), swamped, sqnr, 3.0)


def test_mixed_ranges_judgement_by_hand():
    [finding] = check_mixed_ranges([_mixed(), _mixed(swamped=(2,))], 25.0).findings  # one per tensor
    assert (finding.check, finding.severity, finding.score, finding.subjects) == (
        "mixed_ranges", Severity.HIGH, 2 / 3, ("y",))
    rows = ((1, 2.0, 0.8), (2, 1.0, 0.9))
    assert finding.evidence == Evidence(("channel", "max |x|", "zeroed share"), rows)
    assert finding.title == ("graph output y mixes value ranges on axis 1: one scale (0.5) zeroes most "
                             "values of 2 of 3 channels (max |x| 2 vs 100) while its SQNR is 40.0 dB (those "
                             "channels alone: 3.0 dB)")
    [quantized] = check_mixed_ranges([_mixed(role="quantized")], 25.0).findings
    assert quantized.severity is Severity.MEDIUM and quantized.title.startswith("quantized tensor y")
    assert check_mixed_ranges([_mixed(sqnr=24.9)], 25.0).findings == ()  # the damage shows in the SQNR
    assert check_mixed_ranges([_mixed(swamped=())], 25.0).findings == ()


def _stability(spread: float, stable: bool) -> ScaleStability:
    return ScaleStability("t", "minmax", 0.5, (10, 20), (0.4, 0.5), (0.3, 0.45), (0.6, 0.55), spread, stable)


@pytest.mark.parametrize("spread, severity", [(0.2, Severity.MEDIUM), (0.07, Severity.LOW)])
def test_calibration_size_judgement_by_hand(spread, severity):
    [finding] = check_calibration_size([_stability(spread, False), _stability(0.01, True)], 100).findings
    assert (finding.severity, finding.score, finding.subjects) == (severity, spread, ("t",))
    assert finding.title == ("1 scale(s) are not yet stable with 100 calibration samples: t's scale moves "
                             f"by +-{100 * spread:.1f}% across bootstrap resamples")
    assert finding.evidence.rows == (("t", "minmax", 0.5, 0.45, 0.55, spread),)
    assert check_calibration_size([_stability(spread, True)], 100).findings == ()


def test_bootstrap_of_identical_chunks_is_stable_at_every_level(rng):
    x = rng.standard_normal(10).astype(np.float32)
    chunk = _stats("t", x, num_bins=128)
    chunked = ChunkedStats(tuple({"t": chunk} for _ in range(6)), (10,) * 6)
    [item] = bootstrap_stability(chunked, {"t": get_calibrator("minmax")}, rounds=4, tolerance=0.0)
    scale = float(np.float32(np.abs(x).max() / 127))
    assert item.n_samples == (10, 20, 40, 60)  # levels 1, 2, 4 chunks, then all 6
    assert item.scale == pytest.approx(scale, rel=1e-6) and item.spread == 0.0 and item.stable
    assert item.median == item.lo == item.hi == (item.scale,) * 4


def test_sensitive_layers_medium_between_the_thresholds():
    [finding] = check_sensitive_layers(_confirmation(("a", 25.0, 0.2), ("b", 45.0, 0.1)), 30.0, 0.5).findings
    assert (finding.severity, finding.score, finding.subjects) == (Severity.MEDIUM, -25.0, ("a",))
    assert finding.evidence.rows == (("a", "Conv", 1, 40.0, 25.0, 0.2),)  # metric "sqnr": no extra column
    assert finding.title == "1 layer(s) degrade the output on their own: a (fully INT8 output SQNR 30.0 dB)"


def test_qdq_fusion_groups_lint_findings_by_rule_with_their_severity():
    import models_lint

    from quantdbg.diagnostics import RULES, lint

    model = models_lint.quantized_conv("three_problems", zero_point=5, weight_axis=None, c_out=12)
    outcome = check_qdq_fusion(model)
    linted = lint(model)
    assert outcome.data == (linted,)
    assert [(f.severity, f.score) for f in outcome.findings] == [(Severity.HIGH, 1.0), (Severity.MEDIUM, 1.0),
                                                                 (Severity.INFO, 1.0)]
    for finding, item in zip(outcome.findings, linted.findings, strict=True):
        assert finding.title == f"TensorRT lint `{item.check}`: {RULES[item.check].title} (1 node(s))"
        assert finding.evidence == Evidence(("node", "finding"), ((item.subjects[0], item.title),))
        assert finding.fix == item.fix


def _layer(node: str, tensor: str, calibrator_sqnr: dict | None):
    from quantdbg.sensitivity import LayerEvidence, LayerSensitivity
    from quantdbg.sensitivity.report import QuantizedInput

    inputs = (QuantizedInput(0, tensor, "activation", "minmax", 0.1, 0.1, 1),
              QuantizedInput(1, f"{node}.w", "weight", "minmax", 0.1, 0.2, 4))
    evidence = None if calibrator_sqnr is None else LayerEvidence(calibrator_sqnr=calibrator_sqnr)
    return LayerSensitivity(node, "Conv", inputs, 1, 0.0, 0.0, evidence=evidence)


def _report_reading(*layers):
    from quantdbg.sensitivity import SensitivityReport

    return SensitivityReport("local", "sqnr (dB)", True, tuple(layers))


def test_layer_sqnr_takes_the_worst_consumer_per_calibrator():
    from quantdbg.diagnostics.checks.calibrator_disagreement import layer_sqnr

    report = _report_reading(_layer("a", "t", {"minmax": 10.0, "entropy": 25.0}),
                             _layer("b", "t", {"minmax": 12.0, "entropy": 21.0}),
                             _layer("c", "u", None))
    assert layer_sqnr(report) == {"t": {"minmax": 10.0, "entropy": 21.0}}
    assert layer_sqnr(None) == {}


def test_calibrator_disagreement_judged_by_the_consumer_layers(rng):
    x = np.concatenate([rng.standard_normal(100_000), [100.0]]).astype(np.float32)
    calibration = _calibration({"t": _stats("t", x)}, "minmax")
    by_layer = {"minmax": 10.0, "entropy": 25.0, "percentile": 17.0, "mse": 12.0}
    outcome = check_calibrator_disagreement(calibration, _report_reading(_layer("a", "t", by_layer)), 2.0)
    [item] = outcome.data
    assert dict(item.layer_sqnr) == by_layer and item.best == "entropy" and item.gain_db == 15.0
    [finding] = outcome.findings
    assert (finding.severity, finding.score) == (Severity.HIGH, 15.0)
    assert "the best by its consumer layer's local output SQNR beats the one in use by up to 15.0 dB" in \
        finding.title
    assert finding.fix == ("Pick the calibrator per tensor: CalibConfig(per_tensor={'t': 'entropy'}) "
                           "(CLI: --per-tensor t=entropy).")
    for sqnr, severity, gain in (({"entropy": 10.5, "percentile": 11.0}, Severity.MEDIUM, 2.0),  # mse: 12
                                 ({"entropy": 10.5, "percentile": 10.5, "mse": 10.5}, Severity.LOW, 0.5)):
        report = _report_reading(_layer("a", "t", {**by_layer, **sqnr}))
        [finding] = check_calibrator_disagreement(calibration, report, 2.0).findings
        assert (finding.severity, finding.score) == (severity, gain)
    assert finding.fix == ("The calibrator in use is already the best (or within 1 dB) by its consumer "
                           "layer's local output SQNR.")
    assert check_calibrator_disagreement(calibration, None, ratio=1e6, min_gain_db=math.inf).findings == ()


def test_calibrator_disagreement_fires_on_a_material_gain_with_close_clips(rng):
    """Clips well under 2x apart can still differ by several dB at the consumer layer (a ReLU output
    clipped by entropy): the gain alone makes the disagreement material."""
    x = rng.uniform(0.0, 1.0, 100_000).astype(np.float32)
    calibration = _calibration({"relu[0]": _stats("relu[0]", x)}, "entropy")
    [item] = check_calibrator_disagreement(calibration).data
    assert item.ratio < 2.0
    by_layer = {name: 28.8 for name in item.amax}
    for mse, fires in ((39.5, True), (31.0, False)):
        report = _report_reading(_layer("conv2", "relu[0]", {**by_layer, "entropy": 28.8, "mse": mse}))
        outcome = check_calibrator_disagreement(calibration, report)
        assert bool(outcome.findings) is fires
    [finding] = check_calibrator_disagreement(
        calibration, _report_reading(_layer("conv2", "relu[0]", {**by_layer, "entropy": 28.8, "mse": 39.5}))
    ).findings
    assert finding.severity == Severity.HIGH and finding.score == pytest.approx(10.7)
    assert finding.fix == ("Pick the calibrator per tensor: CalibConfig(per_tensor={'relu[[]0]': 'mse'}) "
                           "(CLI: --per-tensor 'relu[[]0]=mse').")


# ----- the doctor as a whole --------------------------------------------------------------------

def test_every_check_is_registered_in_run_order():
    assert tuple(CHECK_REGISTRY) == CHECKS
    assert all(check.name == name for name, check in CHECK_REGISTRY.items())


def test_diagnose_examines_the_model_quantize_builds(rng):
    from quantdbg.diagnostics import lint

    model = models_doctor.outlier_channel_conv()
    data = {"x": rng.standard_normal((16, 3, 8, 8), dtype=np.float32)}
    config = DoctorConfig(quant=QuantConfig(per_channel=False), checks=("weight_zeroing", "qdq_fusion"),
                          threads=1, batch_size=8)
    report = diagnose(model, data, config=config)
    qmodel = quantize(model, data, config.calib, config.quant, batch_size=8)
    assert report.lint == lint(qmodel.model)
    assert report.weights == tuple(weight_zeroing(load_model(model), qmodel))
    assert (report.n_calib_samples, report.n_eval_samples) == (16, 16)


def test_doctor_report_json_keeps_its_format_keys_and_nested_documents(rng):
    data = {"x": rng.standard_normal((8, 3, 8, 8), dtype=np.float32)}
    report = diagnose(models.conv_relu(), data, config=DoctorConfig(checks=("sensitive_layers",), threads=1))
    written = report.to_dict()
    assert written["format"] == "quantdbg.doctor/1"
    assert written["counts"] == {s.value: sum(f.severity is s for f in report.findings) for s in Severity}
    assert list(written["counts"]) == ["high", "medium", "low", "info"]
    assert written["sensitivity"]["format"] == "quantdbg.sensitivity/1"  # its own form, nested
    assert written["sensitivity"] == report.sensitivity.to_dict()
    assert written["config"]["calib"]["per_op"] == []  # calibration configs are written as ordered pairs
    assert DoctorReport.from_dict(json.loads(json.dumps(written))) == report
    nested = "field 'sensitivity.format' is 'x', expected 'quantdbg.sensitivity/1'"
    with pytest.raises(FormatError, match=nested):
        DoctorReport.from_dict({**written, "sensitivity": {"format": "x"}})


def test_fails_follows_fail_on_words():
    finding = Finding("weight_zeroing", Severity.LOW, 0.1, "t", ("n",), NO_EVIDENCE, "f")
    report = DoctorReport("m", 1, 1, (finding,), ())
    assert report.fails("low") and report.fails("info") and not report.fails("medium")
    assert not report.fails("never") and not DoctorReport("m", 1, 1, (), ()).fails("info")


# ----- folded weights ---------------------------------------------------------------------------

def test_folded_weights_finding_lists_each_weight_and_how_it_was_held():
    from quantdbg.diagnostics.checks.folded_weights import check_folded_weights, folded_evidence
    from quantdbg.model.weights import FoldedWeight

    assert check_folded_weights(()) == CheckOutcome()
    items = (FoldedWeight("conv", 1, "conv.w", ("Constant",)),
             FoldedWeight("fc", 1, "fc.w_t", ("Transpose",), ("fc.w",)))
    outcome = check_folded_weights(items)
    finding, = outcome.findings
    assert (finding.check, finding.severity, finding.score, finding.subjects) == (
        "folded_weights", Severity.INFO, 2.0, ("conv", "fc"))
    assert finding.title == ("2 weight(s) were not plain initializers (1 in Constant nodes, 1 behind "
                             "Transpose): folded into initializers; each is quantized as a weight, per "
                             "output channel with its own max|w|")
    assert finding.evidence == folded_evidence(items) == Evidence(
        ("node", "input", "tensor", "held as", "done"),
        (("conv", 1, "conv.w", "Constant node", "folded into an initializer"),
         ("fc", 1, "fc.w_t", "Transpose of initializer 'fc.w'", "folded into an initializer")))
    assert outcome.data == items


def test_diagnose_lists_the_weights_a_constant_node_export_held(rng):
    import export_forms
    import models_weights

    model = export_forms.constants(models_weights.small_cnn())
    data = {"x": rng.standard_normal((8, 3, 8, 8), dtype=np.float32)}
    report = diagnose(model, data, config=DoctorConfig(checks=("folded_weights",), threads=1))
    finding, = report.findings
    assert finding.check == "folded_weights"
    assert [row[:3] for row in finding.evidence.rows] == [("conv1", 1, "conv1.w"), ("conv2", 1, "conv2.w"),
                                                          ("fc", 1, "fc.w")]
    assert [w.node for w in report.folded_weights] == ["conv1", "conv2", "fc"]
    assert DoctorReport.from_dict(json.loads(json.dumps(report.to_dict()))) == report
    only = DoctorConfig(checks=("folded_weights",), threads=1)
    clean = diagnose(models_weights.small_cnn(), data, config=only)
    assert clean.findings == () and clean.folded_weights == ()
