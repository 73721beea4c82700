"""The output-space ranking: each layer alone in INT8 on the first batches, against ONNX Runtime and NumPy
oracles; which metric it reads; how it travels in the report (JSON, resume)."""
from __future__ import annotations

import json

import models_sensitivity as ms
import numpy as np
import onnxruntime as ort
import pytest

from quantdbg.backends import OnnxrtRunnerFactory, OrtConfig
from quantdbg.config import Precision
from quantdbg.errors import ConfigError
from quantdbg.evaluation import Accuracy, ModelFunction, OutputFunction, compare_arrays
from quantdbg.model import load_model
from quantdbg.model.names import name_nodes
from quantdbg.qdq import remove_qdq
from quantdbg.sensitivity import SensitivityConfig, SensitivityReport, VariantEvaluator, analyze_sensitivity
from quantdbg.sensitivity.analyze import finished_report
from quantdbg.sensitivity.config import OUTPUT_SAMPLES
from quantdbg.sensitivity.output_space import OutputSpace, measure_output_space

ONE_THREAD = OnnxrtRunnerFactory(OrtConfig(intra_op_num_threads=1))


@pytest.fixture(scope="module")
def planted():
    """mlp4 with fc2's input range 100x too small, 4 batches of 4 samples."""
    model = ms.mlp4()
    feeds = ms.feeds_for(model, np.random.default_rng(0), batches=4)
    return model, feeds, ms.quantize_by_hand(model, feeds, {"act1": 0.01})


def _outputs(model, feeds) -> np.ndarray:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.add_session_config_entry("session.disable_quant_qdq", "1")
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return np.concatenate([session.run(None, feed)[0] for feed in feeds])


def _analyze(model, feeds, qmodel, metric="sqnr", **settings) -> SensitivityReport:
    config = SensitivityConfig(evidence=False, **settings)
    return analyze_sensitivity(model, qmodel, feeds, config, metric=metric, runner_factory=ONE_THREAD)


def test_each_layer_alone_on_the_first_batches_matches_onnxruntime(planted):
    model, feeds, qmodel = planted
    report = _analyze(model, feeds, qmodel, output_samples=7)  # the first 2 batches of 4 samples hold them
    space = report.output_space
    assert space is not None and space.n_batches == 2 and space.n_samples == 8
    reference = _outputs(name_nodes(load_model(model)), feeds[:2])
    for layer in qmodel.layers:
        alone = remove_qdq(qmodel, [n for n in qmodel.layers if n != layer], Precision.FP32).model
        want = compare_arrays(reference, _outputs(alone, feeds[:2])).sqnr_db
        assert space.values[layer] == pytest.approx(want, abs=1e-3)
        assert space.sqnr_db[layer] == space.values[layer]  # the task metric is the SQNR here
    assert space.ranking == tuple(sorted(qmodel.layers, key=lambda n: space.values[n]))
    assert space.ranking[0] == "fc2" and space.metric == "sqnr" and space.higher_is_better
    assert report.n_passes == 1  # the short passes are not full passes


def test_only_modes_ranking_by_own_error_get_it(planted):
    model, feeds, qmodel = planted
    assert _analyze(model, feeds, qmodel, output_samples=0).output_space is None
    assert _analyze(model, feeds, qmodel, mode="isolated").output_space is None
    assert _analyze(model, feeds, qmodel, mode="cumulative", output_samples=4).output_space.n_batches == 1
    assert OUTPUT_SAMPLES == 64 and _analyze(model, feeds, qmodel).output_space.n_samples == 16  # every batch


def test_the_cost_is_counted_in_samples_so_one_sample_feeds_get_as_many(planted):
    model, feeds, qmodel = planted
    single = [{"x": feed["x"][i:i + 1]} for feed in feeds for i in range(4)]
    with VariantEvaluator(model, qmodel, single, "sqnr", ONE_THREAD) as evaluator:
        assert evaluator.batches_holding(6) == 6 and evaluator.batches_holding(100) == 16
        one_by_one = measure_output_space(evaluator, 8)
    with VariantEvaluator(model, qmodel, feeds, "sqnr", ONE_THREAD) as evaluator:
        batched = measure_output_space(evaluator, 8)
    assert (one_by_one.n_batches, one_by_one.n_samples, batched.n_batches, batched.n_samples) == (8, 8, 2, 8)
    for layer in qmodel.layers:  # the same 8 samples either way
        assert one_by_one.values[layer] == pytest.approx(batched.values[layer], abs=1e-3)


def test_accuracy_is_scored_on_the_labels_of_the_first_batches(planted):
    model, feeds, qmodel = planted
    labels = np.arange(16) % 16
    with VariantEvaluator(model, qmodel, feeds, Accuracy(labels), ONE_THREAD) as evaluator:
        space = measure_output_space(evaluator, 4)
    assert space.metric == "accuracy" and space.n_samples == 4 and space.n_batches == 1
    for layer in qmodel.layers:
        alone = remove_qdq(qmodel, [n for n in qmodel.layers if n != layer], Precision.FP32).model
        predictions = _outputs(alone, feeds[:1]).argmax(axis=-1)
        assert space.values[layer] == float((predictions == labels[:4]).mean())


def test_model_file_metrics_fall_back_to_the_outputs_sqnr(planted):
    model, feeds, qmodel = planted
    calls = []
    metric = ModelFunction(lambda path: calls.append(path) or 1.0, "file_metric")
    with VariantEvaluator(model, qmodel, feeds, metric, ONE_THREAD) as evaluator:
        space = measure_output_space(evaluator, 8)
    assert space.metric == "sqnr" and space.ranking[0] == "fc2" and calls == []


def test_a_metric_that_needs_every_sample_says_how_to_avoid_the_short_passes(planted):
    model, feeds, qmodel = planted

    def needs_all(outputs, reference) -> float:
        if len(next(iter(outputs.values()))) != 16:
            raise ValueError("expected 16 samples")
        return 1.0

    with VariantEvaluator(model, qmodel, feeds, OutputFunction(needs_all, "recall"), ONE_THREAD) as evaluator:
        with pytest.raises(ConfigError, match=r"^The output-space ranking scores 'recall' on the first 2 "
                                              r"batch\(es\) of the evaluation data, and it failed there "
                                              r"\(ValueError: expected 16 samples\)\. Set "
                                              r"SensitivityConfig\(output_samples=0\) to skip"):
            measure_output_space(evaluator, 8)
        assert measure_output_space(evaluator, 16).values["fc0"] == 1.0


def test_report_json_keeps_both_rankings_and_old_reports_read_unchanged(planted, tmp_path):
    model, feeds, qmodel = planted
    report = _analyze(model, feeds, qmodel)
    data = json.loads(json.dumps(report.to_dict(), allow_nan=False))
    assert SensitivityReport.from_dict(data) == report
    assert data["fused_ranking"] == list(report.fused_ranking)
    assert data["agreement"]["spearman"] == report.agreement.spearman
    assert OutputSpace.from_dict(data["output_space"]) == report.output_space
    plain = _analyze(model, feeds, qmodel, output_samples=0).to_dict()
    assert not {"output_space", "fused_ranking", "agreement"} & set(plain)
    assert SensitivityReport.from_dict(plain).fused_ranking == SensitivityReport.from_dict(plain).ranking


def test_a_finished_report_gets_its_output_space_ranking_when_resumed(planted, tmp_path):
    model, feeds, qmodel = planted
    path = tmp_path / "report.json"
    first = _analyze(model, feeds, qmodel, output_samples=0, results_path=path)
    assert first.output_space is None
    again = _analyze(model, feeds, qmodel, results_path=path)
    assert again.output_space is not None and again.layers == first.layers
    assert finished_report(path) == again  # the journal's last report


def test_config_field_is_validated_and_round_trips():
    with pytest.raises(ConfigError, match=r"^output_samples must be >= 0 \(0: no output-space ranking\), "
                                          r"got -1\.$"):
        SensitivityConfig(output_samples=-1)
    config = SensitivityConfig(output_samples=5)
    assert SensitivityConfig.from_dict(json.loads(json.dumps(config.to_dict()))) == config
