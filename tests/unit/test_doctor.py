"""The doctor: each check fires on a model built to trigger it and stays quiet where it must not."""
from __future__ import annotations

import json
import math

import models
import models_doctor
import numpy as np
import pytest

from quantdbg.calibration import (
    CalibrationResult,
    CollectConfig,
    Collector,
    TensorRange,
    collect_stats,
    get_calibrator,
)
from quantdbg.config import CalibConfig, QuantConfig
from quantdbg.diagnostics.checks import (
    CHECKS,
    ChunkedStats,
    Confirmation,
    Evidence,
    Finding,
    LayerConfirmation,
    bootstrap_stability,
    check_calibration_size,
    check_calibrator_disagreement,
    check_mixed_ranges,
    check_qdq_fusion,
    check_sensitive_layers,
    check_weight_zeroing,
    collect_chunked,
    confirm_layers,
    histogram_sqnr,
    mixed_ranges,
    sort_findings,
    weight_zeroing,
)
from quantdbg.diagnostics.doctor import CheckRun, DoctorConfig, DoctorReport, diagnose, format_text
from quantdbg.errors import ConfigError
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
    assert finding.evidence.rows[0][3] == pytest.approx(per_tensor.mean())


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
    chunked = collect_chunked(model, feeds, ["conv_out"], ["conv_out"], chunks=4, num_bins=128, threads=1)
    assert chunked.sizes == (6, 5, 5, 5)
    per_chunk = [collect_stats(model, {"x": x[k::4]}, ["conv_out"], CollectConfig(True, 128))["conv_out"]
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
    mk = lambda check, sev, score: Finding(check, sev, score, f"{check}-{sev}", (), Evidence(("a",)), "")  # noqa: E731
    found = sort_findings([mk("qdq_fusion", "info", 9), mk("weight_zeroing", "medium", 1),
                           mk("mixed_ranges", "high", 0.1), mk("calibration_size", "medium", 5)])
    assert [f.title for f in found] == ["mixed_ranges-high", "calibration_size-medium",
                                        "weight_zeroing-medium", "qdq_fusion-info"]


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
    assert CheckRun.from_dict(CheckRun("mixed_ranges", "failed", "x", 1.0).to_dict()).detail == "x"
    with pytest.raises(ConfigError, match="Not a quantdbg doctor report"):
        DoctorReport.from_dict({"format": "quantdbg.sensitivity/1"})
