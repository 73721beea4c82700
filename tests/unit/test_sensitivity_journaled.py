"""Evaluations through the journal: each made once and counted in its phase, kept in the file; the
journaled evaluator, metric and scores give what the plain ones give; the flow's ingredients."""
from __future__ import annotations

import json

import models_sensitivity as ms
import numpy as np
import pytest

from quantdbg._journal import Journal
from quantdbg.backends import OnnxrtRunnerFactory, OrtConfig
from quantdbg.config import CalibConfig
from quantdbg.data import ArrayData
from quantdbg.evaluation import CommandMetric, ModelFunction, OutputFunction, OutputMetric, Top1Agreement
from quantdbg.fallback import FallbackTarget
from quantdbg.model.load import as_loaded
from quantdbg.pipeline import AutoConfig
from quantdbg.pipeline.flow import _ingredients
from quantdbg.qdq import quantize
from quantdbg.sensitivity import VariantEvaluator
from quantdbg.sensitivity.evaluator import VariantResult
from quantdbg.sensitivity.journaled import (
    EvaluationRecord,
    JournaledEvaluator,
    JournaledMetric,
    JournaledScores,
    analysis_metric,
    evaluation,
    model_key,
)

ONE_THREAD = OnnxrtRunnerFactory(OrtConfig(intra_op_num_threads=1))


class Counter:
    def __init__(self, value: float) -> None:
        self.value = value
        self.calls = 0

    def __call__(self) -> VariantResult:
        self.calls += 1
        return VariantResult(None, self.value)


def _journal(path=None):
    return Journal.open(path, "auto", {"model": "m"})


def test_each_evaluation_is_made_once_and_counted_in_its_phase(tmp_path):
    journal = _journal(tmp_path / "p.json")
    a, b = Counter(1.0), Counter(2.0)
    journal.phase = "int8"
    assert evaluation(journal, "a", a).value == 1.0
    journal.phase = "search"
    assert evaluation(journal, "b", b).value == 2.0
    assert evaluation(journal, "a", a).value == 1.0 and evaluation(journal, "b", b).value == 2.0
    assert (a.calls, b.calls) == (1, 1)
    assert journal.used == {"evaluation:a": "int8", "evaluation:b": "search"}
    restored = _journal(tmp_path / "p.json")
    assert evaluation(restored, "b", Counter(9.0)).value == 2.0  # from the file, not recomputed
    assert restored.used == {"evaluation:b": "search"}  # what this run used, in the phase that made it
    assert EvaluationRecord.from_dict(restored.get("evaluation:b")) == EvaluationRecord("search", 2.0)


def test_passes_are_kept_in_the_file(tmp_path, rng):
    model = ms.mlp4()
    calibration = quantize(model, {"x": rng.standard_normal((8, 16), dtype=np.float32)},
                           CalibConfig("minmax")).calibration
    journal = _journal(tmp_path / "p.json")
    codec = (type(calibration).to_dict, type(calibration).from_dict)
    assert journal.stored("c", lambda: calibration, *codec) is calibration
    restored = _journal(tmp_path / "p.json")
    kept = restored.stored("c", lambda: pytest.fail("recomputed"), *codec)
    assert kept.ranges == calibration.ranges and kept.stats == calibration.stats


def test_evaluation_records_round_trip():
    record = EvaluationRecord("search", 0.5)
    assert EvaluationRecord.from_dict(json.loads(json.dumps(record.to_dict()))) == record


def test_the_flows_ingredients_change_with_every_input(rng, tmp_path):
    model = as_loaded(ms.mlp4())
    calib = ArrayData({"x": rng.standard_normal((4, 16), dtype=np.float32)})
    evals = ArrayData({"x": rng.standard_normal((4, 16), dtype=np.float32)})
    sqnr, target, config = OutputMetric("sqnr"), FallbackTarget.min_sqnr(30), AutoConfig(resume_path="r")
    base = _ingredients(model, calib, evals, sqnr, target, config)
    assert base == _ingredients(as_loaded(ms.mlp4()), calib, evals, OutputMetric("sqnr"), target,
                                AutoConfig(resume_path="elsewhere", progress=True))
    changed = {
        "model": _ingredients(as_loaded(ms.mlp4(seed=1)), calib, evals, sqnr, target, config),
        "calibration data": _ingredients(model, evals, evals, sqnr, target, config),
        "evaluation data": _ingredients(model, calib, calib, sqnr, target, config),
        "metric": _ingredients(model, calib, evals, OutputMetric("cosine"), target, config),
        "target": _ingredients(model, calib, evals, sqnr, FallbackTarget.min_sqnr(31), config),
        "settings": _ingredients(model, calib, evals, sqnr, target,
                                 AutoConfig(CalibConfig("minmax"), resume_path="r")),
    }
    for name, found in changed.items():
        assert [k for k in base if base[k] != found[k]] == [name], name
    (tmp_path / "score.py").write_text("print(1)\n")
    command = CommandMetric("python score.py {model}", cwd=tmp_path)
    found = _ingredients(model, calib, evals, command, target, config)
    assert "evaluation command's file 'score.py'" in found


def test_the_journaled_evaluator_gives_the_plain_evaluators_values(rng, tmp_path):
    model = ms.mlp4()
    data = {"x": rng.standard_normal((12, 16), dtype=np.float32)}
    qmodel = quantize(model, data, CalibConfig("minmax"))
    journal = _journal(tmp_path / "p.json")
    with VariantEvaluator(model, qmodel, data, "sqnr", ONE_THREAD) as plain, \
            JournaledEvaluator(model, qmodel, data, "sqnr", ONE_THREAD, journal=journal) as journaled:
        assert journaled.run(["fc2", "fc0"]) == plain.run(["fc0", "fc2"])
        assert journaled.run_model(qmodel.model) == plain.run_model(qmodel.model)
        assert journaled.reference_value() == plain.reference_value() == float("inf")
        passes = journaled.n_passes
        assert journaled.run(["fc0", "fc2"]).value == plain.run(["fc0", "fc2"]).value
        assert journaled.n_passes == passes  # answered by the journal
    keys = list(journal.entries)
    assert len(keys) == 3 and keys[1].startswith("evaluation:model:")
    assert keys[1].endswith(model_key(qmodel.model))


def test_the_journaled_metric_evaluates_each_model_file_once(rng, tmp_path):
    model = ms.mlp4()
    qmodel = quantize(model, {"x": rng.standard_normal((4, 16), dtype=np.float32)}, CalibConfig("minmax"))
    seen = []
    inner = ModelFunction(lambda path: seen.append(path) or float(len(seen)), name="count",
                          higher_is_better=False)
    metric = JournaledMetric(inner, _journal())
    assert (metric.name, metric.higher_is_better, metric.needs_model) == ("count", False, True)
    assert metric.describe() == "count (lower is better)"
    assert metric.evaluate_model(qmodel.model) == 1.0
    assert metric.evaluate_model(qmodel.model) == 1.0 and len(seen) == 1
    assert metric.evaluate_model(model) == 2.0 and len(seen) == 2


def test_scores_of_an_analysis_are_journaled_by_the_outputs_scored():
    journal = _journal()
    calls = []
    inner = OutputFunction(lambda out, ref: calls.append(1) or float(out["y"].sum()), name="total")
    scores = JournaledScores(inner, journal)
    assert (scores.name, scores.higher_is_better, scores.needs_model) == ("total", True, False)
    reference = {"y": np.zeros(3, np.float32)}
    one, two = {"y": np.ones(3, np.float32)}, {"y": np.full(3, 2.0, np.float32)}
    assert scores.from_outputs(one, reference) == 3.0 and scores.from_outputs(two, reference) == 6.0
    assert scores.from_outputs({"y": np.ones(3, np.float32)}, reference) == 3.0 and len(calls) == 2
    assert scores.from_outputs(one, two) == 3.0 and len(calls) == 3  # another reference: another score
    assert scores.describe() == "total (higher is better)"


def test_the_analysis_gets_a_journaled_metric_only_for_user_code():
    journal = _journal()
    pooled, model_file = OutputMetric("sqnr"), JournaledMetric(ModelFunction(lambda p: 1.0), journal)
    assert analysis_metric(pooled, journal) is pooled and analysis_metric(model_file, journal) is model_file
    for metric in (OutputMetric("sqnr", output="y"), Top1Agreement(), OutputFunction(lambda o, r: 1.0)):
        wrapped = analysis_metric(metric, journal)
        assert isinstance(wrapped, JournaledScores) and wrapped.inner is metric


def test_a_model_file_metric_is_journaled_by_the_evaluator_whoever_asks(rng, tmp_path):
    model = ms.mlp4()
    data = {"x": rng.standard_normal((4, 16), dtype=np.float32)}
    qmodel = quantize(model, data, CalibConfig("minmax"))
    seen = []
    inner = ModelFunction(lambda path: seen.append(path) or 0.5, name="count")
    journal = _journal(tmp_path / "p.json")
    with JournaledEvaluator(model, qmodel, data, inner, ONE_THREAD, journal=journal) as evaluator:
        assert isinstance(evaluator.metric, JournaledMetric) and evaluator.metric.inner is inner
        first = evaluator.run(["fc0"])
        assert evaluator.run(["fc0"]) == first and evaluator.metric.evaluate_model(
            evaluator.variant_model(["fc0"])) == first.value
        assert evaluator.with_metric("sqnr").journal is journal
    assert len(seen) == 1 and list(journal.used) == list(journal.entries)


def test_two_metrics_on_one_journal_never_share_an_evaluation(rng):
    model = ms.mlp4()
    data = {"x": rng.standard_normal((4, 16), dtype=np.float32)}
    qmodel = quantize(model, data, CalibConfig("minmax"))
    journal = _journal()
    with JournaledEvaluator(model, qmodel, data, "sqnr", ONE_THREAD, journal=journal) as sqnr, \
            JournaledEvaluator(model, qmodel, data, "cosine", ONE_THREAD, journal=journal) as cosine:
        assert sqnr.run(["fc1"]).value != cosine.run(["fc1"]).value
    assert len(journal.used) == 2 and all(key in journal for key in journal.used)
