"""Sensitivity analysis: a planted bad layer, NumPy oracles, graph invariants, resume, JSON."""
from __future__ import annotations

import json
import math

import models_sensitivity as ms
import numpy as np
import onnx
import onnxruntime as ort
import pytest

from quantdbg._journal import Journal
from quantdbg.backends import OnnxrtRunnerFactory, OrtConfig
from quantdbg.config import Precision, TensorKind
from quantdbg.errors import ConfigError, FormatError, ModelError
from quantdbg.evaluation import OutputFunction, compare_arrays
from quantdbg.model import load_model
from quantdbg.model.names import name_nodes
from quantdbg.qdq import QdqRecord, remove_qdq
from quantdbg.sensitivity import (
    SensitivityConfig,
    SensitivityReport,
    VariantEvaluator,
    analyze_sensitivity,
    suggest_calibrators,
)
from quantdbg.sensitivity import graphs as _analysis
from quantdbg.sensitivity.analyze import finished_report
from quantdbg.sensitivity.config import MODES
from quantdbg.sensitivity.evaluator import VariantResult
from quantdbg.sensitivity.measurement import Measurement
from quantdbg.sensitivity.modes import MODE_FUNCTIONS
from quantdbg.sensitivity.reductions import sums_to_metrics
from quantdbg.sensitivity.suggest import _glob_escape

ONE_THREAD = OnnxrtRunnerFactory(OrtConfig(intra_op_num_threads=1))
PLANTED = {"mlp4": ("act1", "fc2"), "small_cnn": ("r1", "conv2")}


def _analyze(model, qmodel, feeds, *, metric="sqnr", runner_factory=ONE_THREAD,
             **settings) -> SensitivityReport:
    return analyze_sensitivity(model, qmodel, feeds, SensitivityConfig(**settings), metric=metric,
                               runner_factory=runner_factory)


def _session(model: onnx.ModelProto) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.add_session_config_entry("session.disable_quant_qdq", "1")  # Q/DQ as ONNX defines it
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


@pytest.fixture(scope="module")
def planted():
    """name -> (fp32 model, feeds, Q/DQ model with one activation range 100x too small)."""
    rng = np.random.default_rng(0)
    out = {}
    for name, (tensor, _) in PLANTED.items():
        model = getattr(ms, name)()
        feeds = ms.feeds_for(model, rng)
        out[name] = (model, feeds, ms.quantize_by_hand(model, feeds, {tensor: 0.01}))
    return out


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", sorted(PLANTED))
def test_every_mode_ranks_the_planted_layer_first(planted, name, mode):
    model, feeds, qmodel = planted[name]
    report = _analyze(model, qmodel, feeds, mode=mode, runner_factory=ONE_THREAD,
                                 evidence=False)
    assert report.ranking[0] == PLANTED[name][1]
    assert sorted(report.ranking) == sorted(qmodel.layers)
    assert [layer.rank for layer in report.layers] == list(range(1, len(qmodel.layers) + 1))


def test_switch_graph_reproduces_both_models(planted):
    model, feeds, qmodel = planted["small_cnn"]
    fp = name_nodes(load_model(model))
    switch = _analysis.switch_graph(qmodel, fp)
    switches = [n for n in switch.model.graph.node if n.op_type == "If"]
    assert len(switches) == len(qmodel.records)  # one switched pair per record
    top_level = {n.op_type for n in switch.model.graph.node}
    assert not top_level & {"QuantizeLinear", "DequantizeLinear"}  # Q/DQ only run inside a switched-on branch
    assert set(switch.switches) == set(qmodel.layers)
    session, q_session, fp_session = _session(switch.model), _session(qmodel.model), _session(fp)
    for feed in feeds:
        all_on = session.run(None, {**feed, **switch.feed(qmodel.layers)})[0]
        all_off = session.run(None, {**feed, **switch.feed(())})[0]
        np.testing.assert_allclose(all_on, q_session.run(None, feed)[0], rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(all_off, fp_session.run(None, feed)[0], rtol=1e-5, atol=1e-6)


def test_isolated_variant_equals_the_model_with_other_pairs_removed(planted):
    model, feeds, qmodel = planted["mlp4"]
    report = _analyze(model, qmodel, feeds, mode="isolated", runner_factory=ONE_THREAD,
                                 evidence=False)
    fp_session = _session(name_nodes(load_model(model)))
    for layer in qmodel.layers:
        only = remove_qdq(qmodel, [n for n in qmodel.layers if n != layer], Precision.FP32)
        session = _session(only.model)
        ref = np.concatenate([fp_session.run(None, f)[0] for f in feeds])
        got = np.concatenate([session.run(None, f)[0] for f in feeds])
        assert report.layer(layer).value == pytest.approx(compare_arrays(ref, got).sqnr_db, abs=1e-3)


def _fake_quant(x: np.ndarray, record: QdqRecord) -> np.ndarray:
    scale = np.asarray(record.scale, np.float32)
    lo, hi = (-128, 127) if record.kind is TensorKind.ACTIVATION else (-127, 127)
    return (np.clip(np.round(x / scale), lo, hi) * scale).astype(np.float32)


def test_local_error_matches_numpy_fake_quantization(planted):
    model, feeds, qmodel = planted["mlp4"]
    report = _analyze(model, qmodel, feeds, mode="local", runner_factory=ONE_THREAD,
                                 evidence=False)
    fp = name_nodes(load_model(model))
    weights = {i.name: onnx.numpy_helper.to_array(i) for i in fp.graph.initializer}
    for layer in qmodel.layers:
        act, weight = sorted(qmodel.records_of(layer), key=lambda r: r.input_index)
        if act.tensor == "x":
            xs = [f["x"] for f in feeds]
        else:
            xs = ms.run_exposed(fp, feeds, [act.tensor])[act.tensor]
        w = weights[weight.tensor]
        ref = np.concatenate([x.astype(np.float64) @ w for x in xs])
        got = np.concatenate([_fake_quant(x, act).astype(np.float64) @ _fake_quant(w, weight) for x in xs])
        want = 10 * np.log10((ref**2).sum() / ((got - ref) ** 2).sum())
        assert report.layer(layer).value == pytest.approx(want, abs=0.01)
    assert report.n_passes == 1  # the whole local ranking is one pass


def test_cumulative_tracks_every_tensor(planted):
    model, feeds, qmodel = planted["mlp4"]
    report = _analyze(model, qmodel, feeds, mode="cumulative", runner_factory=ONE_THREAD,
                                 evidence=False)
    tensors = {t.tensor: t for t in report.tensors}
    assert list(tensors) == ["mm0", "act0", "mm1", "act1", "mm2", "act2", "y"]  # every node output, in order
    assert tensors["act0"].node == "relu0" and tensors["act0"].op_type == "Relu"
    assert tensors["y"].metrics.sqnr_db == pytest.approx(report.baseline.total.sqnr_db)
    bad = report.layer("fc2")
    assert bad.input_metrics.sqnr_db > 30 > 5 > bad.metrics.sqnr_db  # the error jumps at fc2
    assert tensors["mm2"].metrics.sqnr_db == bad.metrics.sqnr_db


def test_parallel_jobs_give_the_same_report(planted):
    model, feeds, qmodel = planted["small_cnn"]
    one = _analyze(model, qmodel, feeds, mode="leave-one-out", runner_factory=ONE_THREAD,
                                 evidence=False)
    two = _analyze(model, qmodel, feeds, mode="leave-one-out", runner_factory=ONE_THREAD, jobs=2,
                              evidence=False)
    assert two.ranking == one.ranking
    assert [x.value for x in two.layers] == pytest.approx([x.value for x in one.layers], rel=1e-9)


class _Counting(OutputFunction):
    def __init__(self, fail_after: int | None = None) -> None:
        super().__init__(self._score, name="mean_abs", higher_is_better=False)
        self.calls = 0
        self.fail_after = fail_after

    def _score(self, outputs, reference):
        self.calls += 1
        if self.fail_after is not None and self.calls > self.fail_after:
            raise KeyboardInterrupt
        return float(np.mean(np.abs(outputs["y"] - reference["y"])))


def test_interrupted_sweep_resumes_from_its_results_file(planted, tmp_path):
    model, feeds, qmodel = planted["mlp4"]
    path = tmp_path / "sweep.json"
    with pytest.raises(KeyboardInterrupt):
        _analyze(model, qmodel, feeds, mode="isolated", metric=_Counting(fail_after=2),
                            runner_factory=ONE_THREAD, results_path=path, evidence=False)
    assert len(Journal.read(path).entries) == 2  # the baseline and one layer, nothing else
    resumed_metric = _Counting()
    resumed = _analyze(model, qmodel, feeds, mode="isolated", metric=resumed_metric,
                                  runner_factory=ONE_THREAD, results_path=path, evidence=False)
    assert resumed_metric.calls == len(qmodel.layers) + 1 - 2 + 1  # the rest, plus the FP32 reference value
    fresh = _analyze(model, qmodel, feeds, mode="isolated", metric=_Counting(),
                                runner_factory=ONE_THREAD,
                                 evidence=False)
    assert resumed.ranking == fresh.ranking
    assert [x.value for x in resumed.layers] == pytest.approx([x.value for x in fresh.layers])
    assert finished_report(path) == resumed  # the finished journal holds the report
    with_evidence = _analyze(model, qmodel, feeds, mode="isolated", metric=_Counting(),
                                        runner_factory=ONE_THREAD, results_path=path)
    assert with_evidence.ranking == resumed.ranking  # evidence added to the finished sweep, not redone
    assert all(layer.evidence is not None for layer in finished_report(path).layers)
    with pytest.raises(ConfigError, match=r"belongs to another run: the mode changed; pass --restart to "
                                          r"start over \(or delete the file\)\.$"):
        _analyze(model, qmodel, feeds, mode="leave-one-out", metric=_Counting(),
                            runner_factory=ONE_THREAD, results_path=path, evidence=False)


@pytest.mark.parametrize("mode", MODES)
def test_report_json_round_trip(planted, mode):
    model, feeds, qmodel = planted["small_cnn"]
    report = _analyze(model, qmodel, feeds, mode=mode, runner_factory=ONE_THREAD)
    text = json.dumps(report.to_dict(), allow_nan=False)
    assert SensitivityReport.from_dict(json.loads(text)) == report
    top = report.layers[0]
    assert top.evidence is not None and top.evidence.best_calibrator is not None
    assert {i.kind for i in top.inputs} == {"activation", "weight"}


def test_evidence_points_at_the_planted_range(planted):
    model, feeds, qmodel = planted["mlp4"]
    report = _analyze(model, qmodel, feeds, mode="local", runner_factory=ONE_THREAD)
    evidence = report.layer("fc2").evidence
    assert evidence.recorded_sqnr < 5.0
    assert evidence.calibrator_sqnr[evidence.best_calibrator] > evidence.recorded_sqnr + 20


def test_calibrator_suggestions_follow_the_evidence(planted):
    model, feeds, qmodel = planted["mlp4"]
    report = _analyze(model, qmodel, feeds, mode="local", runner_factory=ONE_THREAD)
    suggested = suggest_calibrators(report, only_changes=False)
    for layer in report.layers:  # each activation of mlp4 has one reader: its best calibrator wins
        (act,) = [i.tensor for i in layer.inputs if i.kind == "activation"]
        assert suggested[act] == layer.evidence.best_calibrator
    changed = suggest_calibrators(report)
    assert all(suggested[t] != "minmax" for t in changed)  # hand quantization recorded "minmax"
    assert _glob_escape("a[0]*b?") == "a[[]0][*]b[?]"


def test_argument_errors(planted):
    model, feeds, qmodel = planted["mlp4"]
    with pytest.raises(ModelError, match=r"^Quantized node 'fc0' is not in the FP32 model; pass the FP32 "):
        analyze_sensitivity(ms.small_cnn(), qmodel, feeds)


def test_config_is_validated():
    with pytest.raises(ConfigError, match=r"^Unknown sensitivity mode 'global'; choose one of isolated, "
                                          r"leave-one-out, local, cumulative\.$"):
        SensitivityConfig(mode="global")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"^jobs must be >= 1, got 0\.$"):
        SensitivityConfig(jobs=0)
    with pytest.raises(ConfigError, match=r"^evidence_batches must be >= 1, got 0\.$"):
        SensitivityConfig(evidence_batches=0)


@pytest.mark.parametrize("config", [SensitivityConfig(),
                                    SensitivityConfig("isolated", 3, False, 4, True, "r.json")])
def test_config_json_round_trip(config):
    data = json.loads(json.dumps(config.to_dict(), allow_nan=False))
    assert SensitivityConfig.from_dict(data) == config


def test_every_mode_has_an_implementation():
    assert set(MODE_FUNCTIONS) == set(MODES)


def test_onnxruntime_qdq_model_with_folded_relus(tmp_path, rng):
    """ONNX Runtime's quantizer deletes a Relu and lets a uint8 pair (zero point 0) clamp instead;
    turning such a pair off must keep the clamp, or every variant without it is garbage."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    from quantdbg.qdq import records_from_model

    model = ms.small_cnn()
    feeds = ms.feeds_for(model, rng)
    onnx.save(model, str(tmp_path / "fp32.onnx"))

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.batches = iter(feeds)

        def get_next(self):
            return next(self.batches, None)

    quantize_static(str(tmp_path / "fp32.onnx"), str(tmp_path / "qdq.onnx"), Reader(),
                    quant_format=QuantFormat.QDQ, activation_type=QuantType.QUInt8,
                    weight_type=QuantType.QInt8, per_channel=True)
    qmodel = records_from_model(tmp_path / "qdq.onnx")
    assert "Relu" not in {n.op_type for n in qmodel.model.graph.node}  # the premise: the Relus are gone
    report = _analyze(tmp_path / "fp32.onnx", qmodel, feeds, mode="isolated",
                                 runner_factory=ONE_THREAD, evidence=False)
    # One layer in INT8 is never worse than all of them (before the clamp was kept: -7 dB for conv2).
    assert min(layer.value for layer in report.layers) >= report.baseline.total.sqnr_db - 0.5


def test_the_journal_gets_one_line_per_variant_and_refuses_a_changed_one(planted, tmp_path):
    model, feeds, qmodel = planted["mlp4"]
    path = tmp_path / "sweep.json"
    with pytest.raises(KeyboardInterrupt):
        _analyze(model, qmodel, feeds, mode="leave-one-out", metric=_Counting(fail_after=3),
                 results_path=path, evidence=False)
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert lines[0]["format"] == "quantdbg.journal/1" and lines[0]["kind"] == "analyze"
    assert [line["key"] for line in lines[1:]] == [f"evaluation:sweep:leave-one-out:{name}" for name in
                                                   ("__all_quantized__", "fc0", "fc1")]  # baseline first
    results = [VariantResult.from_dict(line["value"]) for line in lines[1:]]
    assert all(r.comparison is not None for r in results)
    lines[2]["value"]["value"] = 0.0  # a score changed by hand
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    with pytest.raises(ConfigError, match=r"^Resume file '.*sweep\.json' was changed after quantdbg wrote it "
                                          r"\(line 3 does not match its checksum\), so its results cannot be "
                                          r"trusted; pass --restart to start over \(or delete the file\)\.$"):
        _analyze(model, qmodel, feeds, mode="leave-one-out", metric=_Counting(), results_path=path,
                 evidence=False)
    path.write_text("{not json")
    with pytest.raises(FormatError, match=r"^Resume file '.*sweep\.json' is not a quantdbg journal"):
        _analyze(model, qmodel, feeds, mode="leave-one-out", results_path=path)


def test_variant_result_json_round_trip(planted):
    model, feeds, qmodel = planted["mlp4"]
    with VariantEvaluator(model, qmodel, feeds, runner_factory=ONE_THREAD) as evaluator:
        result = evaluator.run(["fc2"])
        with pytest.raises(ModelError, match=r"^No quantized layer named 'fc9' in the model\. Did you mean"):
            evaluator.run(["fc9"])
    assert VariantResult.from_dict(json.loads(json.dumps(result.to_dict(), allow_nan=False))) == result
    assert result.value == result.comparison.total.sqnr_db


def test_pooled_sums_give_the_metrics_of_numpy(rng):
    ref = rng.standard_normal((4, 32)).astype(np.float32)
    test = (ref + 0.05 * rng.standard_normal((4, 32))).astype(np.float32)
    r, t = ref.astype(np.float64), test.astype(np.float64)
    diff = t - r
    found = sums_to_metrics([(r**2).sum(), (diff**2).sum(), (t**2).sum(), np.abs(diff).max(), r.size])
    want = compare_arrays(ref, test)
    assert found.sqnr_db == pytest.approx(want.sqnr_db, rel=1e-12)
    assert found.cosine == pytest.approx(want.cosine, rel=1e-12)
    assert found.rel_l2 == pytest.approx(want.rel_l2, rel=1e-12)
    assert found.max_abs == want.max_abs and found.count == want.count
    assert found.sample_cosine is None  # per-sample cosines are not recoverable from pooled sums


def test_ranking_sinks_nan_scores_and_keeps_graph_order_on_ties(planted):
    model, feeds, qmodel = planted["mlp4"]
    score = {"fc0": 1.0, "fc1": math.nan, "fc2": 1.0, "fc3": 2.0}
    found = Measurement(score, dict(score), {})
    with VariantEvaluator(model, qmodel, feeds, runner_factory=ONE_THREAD) as evaluator:
        report = found.report(evaluator, "local", 0.0, "")
    assert report.ranking == ("fc3", "fc0", "fc2", "fc1")
    assert report.n_samples == sum(len(f["x"]) for f in feeds) and report.n_passes == 0
