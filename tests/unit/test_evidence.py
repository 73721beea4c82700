"""Why a layer is sensitive: weight evidence, outlier ratio and calibrator variants, by hand."""
from __future__ import annotations

import math
from dataclasses import replace

import models_sensitivity as ms
import numpy as np
import pytest
from onnx import numpy_helper

from quantdbg._journal import Journal
from quantdbg.backends import OnnxrtRunnerFactory, OrtConfig
from quantdbg.calibration import TensorStats
from quantdbg.calibration.calibrators.base import calibrator_amaxes
from quantdbg.calibration.stats import Collector
from quantdbg.config import TensorKind
from quantdbg.model import load_model
from quantdbg.model.names import name_nodes
from quantdbg.qdq import QdqRecord
from quantdbg.sensitivity import (
    LayerEvidence,
    SensitivityConfig,
    VariantEvaluator,
    suggest_calibrators,
)
from quantdbg.sensitivity.analyze import analyze_evidence, analyze_variants
from quantdbg.sensitivity.evidence import (
    _distinct,
    calibrator_variants,
    collect_evidence,
    layer_evidence,
    outlier_ratio,
    weight_evidence,
)
from quantdbg.sensitivity.journaled import JournaledEvaluator
from quantdbg.sensitivity.reductions import DataPass, run_local_graph
from quantdbg.sensitivity.report import EvidenceReport


def _record(w_scale: np.ndarray, axis: int | None, op: str = "MatMul") -> QdqRecord:
    return QdqRecord("mm", op, 1, "w", TensorKind.WEIGHT, "q", "dq", tuple(np.ravel(w_scale).tolist()), axis,
                     "absmax")


def test_weight_evidence_matches_numpy():
    w = np.array([[0.01, -0.02, 5.0], [0.03, 0.001, -4.0]], np.float32)  # column 2 dwarfs the others
    scale = np.abs(w).max(axis=0) / 127
    found = weight_evidence(_record(scale, 1), w, None)
    t_scale = np.abs(w).max() / 127
    per_tensor = np.clip(np.round(w / t_scale), -127, 127) * t_scale
    per_channel = np.clip(np.round(w / scale), -127, 127) * scale
    norm = np.linalg.norm(w)
    assert found["weight_error_per_tensor"] == pytest.approx(np.linalg.norm(per_tensor - w) / norm)
    assert found["weight_error_per_channel"] == pytest.approx(np.linalg.norm(per_channel - w) / norm)
    assert found["weight_zero_fraction_per_tensor"] == pytest.approx(np.mean(np.round(w / t_scale) == 0))
    assert found["weight_zero_fraction"] == 0.0


def test_zero_fraction_uses_the_recorded_scales_and_ignores_zero_weights():
    # Conv weight [out=2, in=1, 1, 3]; channel 0 small, channel 1 huge; one exact zero.
    w = np.array([[[[0.004, 0.0, -0.5]]], [[[100.0, 0.3, -0.2]]]], np.float32)
    recorded = np.array([1.0 / 127, 100.0 / 127])  # per output channel (axis 0)
    found = weight_evidence(_record(recorded, 0, "Conv"), w, None)
    ints = np.round(w / recorded.reshape(2, 1, 1, 1))
    nonzero = w != 0
    assert found["weight_zero_fraction"] == pytest.approx(((ints == 0) & nonzero).sum() / nonzero.sum())
    assert found["weight_zero_fraction"] == pytest.approx(2 / 5)  # 0.3 and -0.2 round to 0, 0.004 to 1
    per_channel = np.abs(w).max(axis=(1, 2, 3)) / 127  # Conv's output channels are axis 0
    fq = np.clip(np.round(w / per_channel.reshape(2, 1, 1, 1)), -127, 127) * per_channel.reshape(2, 1, 1, 1)
    assert found["weight_error_per_channel"] == pytest.approx(np.linalg.norm(fq - w) / np.linalg.norm(w))


def _stats(hist: np.ndarray, absmax: float) -> TensorStats:
    return TensorStats("t", -absmax, absmax, int(hist.sum()), hist=hist, hist_range=8.0)


def test_outlier_ratio_is_max_over_the_99_99th_percentile():
    hist = np.zeros(2048, np.int64)  # bins of width 8 / 2048 = 1 / 256
    hist[255] = 1_000_000  # the bulk just below 1.0
    hist[2047] = 1  # one value at max|x| = 8
    assert outlier_ratio(_stats(hist, 8.0)) == 8.0  # clip at the bulk's upper edge, 1.0
    hist[2047] = 1000  # 0.1 % of the values: the percentile now reaches the outliers
    assert outlier_ratio(_stats(hist, 8.0)) == 1.0
    assert outlier_ratio(TensorStats("t", -1.0, 1.0, 10)) is None  # no histogram
    assert outlier_ratio(_stats(np.zeros(2048, np.int64), 0.0)) is None  # all zero


@pytest.fixture(scope="module")
def mlp():
    model = ms.mlp4()
    feeds = ms.feeds_for(model, np.random.default_rng(5))
    return model, feeds, ms.quantize_by_hand(model, feeds)


def _hist_stats(name: str, values: np.ndarray) -> TensorStats:
    collector = Collector([name], histogram=True)
    collector.update(name, values)
    return collector.result()[name]


def test_calibrator_variants_test_every_candidate_range_per_layer(mlp):
    _, _, qmodel = mlp
    rng = np.random.default_rng(0)
    stats = {"act0": _hist_stats("act0", np.abs(rng.standard_normal((64, 16))).astype(np.float32))}
    variants = calibrator_variants(qmodel, qmodel.layers, stats)
    by_layer = {layer: [v for v in variants if v.layer == layer] for layer in qmodel.layers}
    for layer in ("fc0", "fc2", "fc3"):  # no statistics for their activations: the recorded range only
        assert [(v.label, dict(v.activation_amax)) for v in by_layer[layer]] == [("recorded", {})]
    amaxes = calibrator_amaxes(stats["act0"])
    assert [v.label for v in by_layer["fc1"]] == ["recorded", *sorted(amaxes)]
    for variant in by_layer["fc1"][1:]:
        assert dict(variant.activation_amax) == {0: amaxes[variant.label]}  # input 0 reads act0


def test_layer_evidence_picks_the_best_calibrator_and_the_worst_weight(mlp):
    model, _, qmodel = mlp
    fp = name_nodes(load_model(model))
    found = layer_evidence(fp, qmodel, "fc1", {}, {"recorded": 20.0, "minmax": 20.0, "mse": 31.5,
                                                   "entropy": math.nan})
    assert found.best_calibrator == "mse" and found.recorded_sqnr == 20.0
    assert dict(found.calibrator_sqnr) == {"minmax": 20.0, "mse": 31.5, "entropy": pytest.approx(math.nan,
                                                                                                 nan_ok=True)}
    assert found.activation_outlier_ratio is None  # no statistics given
    weights = {i.name: i for i in fp.graph.initializer}
    (weight,) = [r for r in qmodel.records_of("fc1") if r.kind is TensorKind.WEIGHT]
    expected = weight_evidence(weight, numpy_helper.to_array(weights[weight.tensor]), None)
    assert found.weight_error_per_channel == expected["weight_error_per_channel"]
    assert layer_evidence(fp, qmodel, "fc1", {}, {}) == LayerEvidence(**expected)


def test_layer_evidence_json_round_trip_keeps_nan_and_none():
    evidence = LayerEvidence(0.1, 0.05, 0.0, 0.2, None, {"minmax": math.inf, "mse": 12.5}, -math.inf, "mse")
    data = evidence.to_dict()
    assert data["calibrator_sqnr"] == {"minmax": "inf", "mse": 12.5} and data["recorded_sqnr"] == "-inf"
    assert LayerEvidence.from_dict(data) == evidence


def test_evidence_runs_on_the_configured_number_of_batches(mlp):
    model, feeds, qmodel = mlp
    factory = OnnxrtRunnerFactory(OrtConfig(intra_op_num_threads=1))
    one = SensitivityConfig(evidence_batches=1)
    with VariantEvaluator(model, qmodel, feeds, runner_factory=factory) as evaluator:
        found = collect_evidence(evaluator, one)
    assert set(found) == set(qmodel.layers)
    assert evaluator.n_passes == 2  # the statistics (no calibration kept) and the local graph
    for layer, evidence in found.items():
        assert evidence.recorded_sqnr is not None and evidence.best_calibrator is not None, layer


def test_the_evidence_alone_is_the_full_analysis_evidence_and_journaled_once(mlp):
    model, feeds, qmodel = mlp
    factory = OnnxrtRunnerFactory(OrtConfig(intra_op_num_threads=1))
    journal = Journal(None, "auto", {})
    with JournaledEvaluator(model, qmodel, feeds, "sqnr", factory, journal=journal) as evaluator:
        alone = analyze_evidence(evaluator)
        passes = evaluator.n_passes
        assert analyze_evidence(evaluator) == alone and evaluator.n_passes == passes  # from the journal
    with VariantEvaluator(model, qmodel, feeds, runner_factory=factory) as evaluator:
        full = analyze_variants(evaluator, SensitivityConfig())
    assert [entry.node for entry in alone.layers] == list(qmodel.layers)
    by_node = {layer.node: layer for layer in full.layers}
    no_weights = dict.fromkeys(("weight_error_per_tensor", "weight_error_per_channel", "weight_zero_fraction",
                                "weight_zero_fraction_per_tensor", "recorded_sqnr"))
    for entry in alone.layers:  # each calibrator's SQNR and the outliers, the same; no weights, no recorded
        assert entry.inputs == by_node[entry.node].inputs
        assert entry.evidence == replace(by_node[entry.node].evidence, **no_weights)
        assert entry.evidence.calibrator_sqnr
    assert suggest_calibrators(alone) == suggest_calibrators(full)
    assert EvidenceReport.from_dict(alone.to_dict()) == alone


def test_calibrators_choosing_the_same_range_share_one_clone(mlp):
    model, feeds, qmodel = mlp
    factory = OnnxrtRunnerFactory(OrtConfig(intra_op_num_threads=1))
    rng = np.random.default_rng(1)
    clipped = np.clip(np.abs(rng.standard_normal((4096, 16))), 0, 1.5).astype(np.float32)  # a ReLU6-like cap
    stats = {"act0": _hist_stats("act0", clipped)}
    variants = calibrator_variants(qmodel, qmodel.layers, stats)
    amaxes = calibrator_amaxes(stats["act0"])
    assert len(set(amaxes.values())) < len(amaxes)  # some calibrators agree on the clip
    with VariantEvaluator(model, qmodel, feeds, runner_factory=factory) as evaluator:
        every = run_local_graph(evaluator, variants, DataPass("all"))
        distinct, clone_of = _distinct(variants)
        shared = run_local_graph(evaluator, distinct, DataPass("distinct"))
    assert len(distinct) == len(qmodel.layers) + len(set(amaxes.values()))  # one recorded clone per layer
    for index, variant in enumerate(variants):  # the same SQNR, bit for bit
        assert shared[clone_of[index]].sqnr_db == every[index].sqnr_db, variant
