"""The journal: every pass and evaluation computed once, kept in the resume file, counted per phase; the
fingerprint; the journaled evaluator and metric give what the plain ones give."""
from __future__ import annotations

import json

import models_sensitivity as ms
import numpy as np
import pytest

from quantdbg.backends import OnnxrtRunnerFactory, OrtConfig
from quantdbg.config import CalibConfig
from quantdbg.errors import ConfigError, FormatError
from quantdbg.evaluation import ModelFunction, OutputFunction, OutputMetric, Top1Agreement
from quantdbg.fallback import FallbackTarget
from quantdbg.pipeline import (
    AutoProgress,
    EvaluationRecord,
    Journal,
    JournaledEvaluator,
    JournaledMetric,
    JournaledScores,
    analysis_metric,
    fingerprint,
    model_key,
)
from quantdbg.qdq import quantize
from quantdbg.sensitivity import VariantEvaluator, VariantResult

ONE_THREAD = OnnxrtRunnerFactory(OrtConfig(intra_op_num_threads=1))


class Counter:
    def __init__(self, value: float) -> None:
        self.value = value
        self.calls = 0

    def __call__(self) -> VariantResult:
        self.calls += 1
        return VariantResult(None, self.value)


def test_each_evaluation_is_made_once_and_counted_in_its_phase(tmp_path):
    journal = Journal(tmp_path / "p.json", "fp")
    a, b = Counter(1.0), Counter(2.0)
    journal.phase = "int8"
    assert journal.evaluation("a", a).value == 1.0
    journal.phase = "search"
    assert journal.evaluation("b", b).value == 2.0
    assert journal.evaluation("a", a).value == 1.0 and journal.evaluation("b", b).value == 2.0
    assert (a.calls, b.calls) == (1, 1)
    assert journal.counts() == {"int8": 1, "search": 1}
    restored = Journal.open(tmp_path / "p.json", "fp")
    assert restored.evaluation("b", Counter(9.0)).value == 2.0  # from the file, not recomputed
    assert restored.counts() == {"search": 1}  # counts what this run used, in the phase that made it


def test_passes_are_kept_in_the_file(tmp_path, rng):
    model = ms.mlp4()
    calibration = quantize(model, {"x": rng.standard_normal((8, 16), dtype=np.float32)},
                           CalibConfig("minmax")).calibration
    journal = Journal(tmp_path / "p.json", "fp")
    assert journal.calibration("c", lambda: calibration) is calibration
    restored = Journal.open(tmp_path / "p.json", "fp")
    kept = restored.calibration("c", lambda: pytest.fail("recomputed"))
    assert kept.ranges == calibration.ranges and kept.stats == calibration.stats
    document = json.loads((tmp_path / "p.json").read_text())
    assert document["format"] == "quantdbg.auto-progress/1"
    assert AutoProgress.from_dict(document).calibrations["c"].ranges == calibration.ranges


def test_a_file_of_another_run_or_format_is_refused(tmp_path):
    path = tmp_path / "p.json"
    Journal(path, "one").evaluation("a", Counter(1.0))
    with pytest.raises(ConfigError) as err:
        Journal.open(path, "two")
    assert str(err.value) == (f"Resume file {str(path)!r} belongs to another run: it was written by another "
                              "version of quantdbg or another kind of run; delete it to start afresh, or "
                              "choose another resume file.")
    path.write_text(json.dumps({"format": "quantdbg.sensitivity/1", "fingerprint": "one"}))
    with pytest.raises(FormatError, match=r"^Cannot resume: .*not a valid quantdbg.auto-progress/1 document: "
                                          r"format is 'quantdbg.sensitivity/1'.* Or delete the file.$"):
        Journal.open(path, "one")
    path.write_text("{")
    with pytest.raises(FormatError, match="not valid JSON"):
        Journal.open(path, "one")
    assert Journal.open(tmp_path / "absent.json", "one").evaluations == {}


def test_evaluation_records_round_trip():
    record = EvaluationRecord("search", 0.5)
    assert EvaluationRecord.from_dict(json.loads(json.dumps(record.to_dict()))) == record


def test_the_fingerprint_changes_with_every_input(rng):
    model = ms.mlp4()
    calib = [{"x": rng.standard_normal((4, 16), dtype=np.float32)}]
    evals = [{"x": rng.standard_normal((4, 16), dtype=np.float32)}]
    sqnr, target = OutputMetric("sqnr"), FallbackTarget.min_sqnr(30)
    base = fingerprint(model, calib, evals, sqnr, target, CalibConfig())
    assert base == fingerprint(ms.mlp4(), calib, evals, OutputMetric("sqnr"), target, CalibConfig())
    changed = [
        fingerprint(ms.mlp4(seed=1), calib, evals, sqnr, target, CalibConfig()),
        fingerprint(model, evals, evals, sqnr, target, CalibConfig()),
        fingerprint(model, calib, calib, sqnr, target, CalibConfig()),
        fingerprint(model, calib, evals, OutputMetric("cosine"), target, CalibConfig()),
        fingerprint(model, calib, evals, sqnr, FallbackTarget.min_sqnr(31), CalibConfig()),
        fingerprint(model, calib, evals, sqnr, target, CalibConfig("minmax")),
    ]
    assert len({base, *changed}) == 7


def test_the_journaled_evaluator_gives_the_plain_evaluators_values(rng, tmp_path):
    model = ms.mlp4()
    data = {"x": rng.standard_normal((12, 16), dtype=np.float32)}
    qmodel = quantize(model, data, CalibConfig("minmax"))
    journal = Journal(tmp_path / "p.json", "fp")
    with VariantEvaluator(model, qmodel, data, "sqnr", ONE_THREAD) as plain, \
            JournaledEvaluator(model, qmodel, data, OutputMetric("sqnr"), ONE_THREAD, journal) as journaled:
        assert journaled.run(["fc2", "fc0"]) == plain.run(["fc0", "fc2"])
        assert journaled.run_model(qmodel.model) == plain.run_model(qmodel.model)
        assert journaled.reference_value() == plain.reference_value() == float("inf")
        passes = journaled.n_passes
        assert journaled.run(["fc0", "fc2"]).value == plain.run(["fc0", "fc2"]).value
        assert journaled.n_passes == passes  # answered by the journal
    assert len(journal.evaluations) == 3 and f"model:{model_key(qmodel.model)}" in journal.evaluations


def test_the_journaled_metric_evaluates_each_model_file_once(rng, tmp_path):
    model = ms.mlp4()
    qmodel = quantize(model, {"x": rng.standard_normal((4, 16), dtype=np.float32)}, CalibConfig("minmax"))
    seen = []
    inner = ModelFunction(lambda path: seen.append(path) or float(len(seen)), name="count",
                          higher_is_better=False)
    metric = JournaledMetric(inner, Journal(None, "fp"))
    assert (metric.name, metric.higher_is_better, metric.needs_model) == ("count", False, True)
    assert metric.describe() == "count (lower is better)"
    assert metric.evaluate_model(qmodel.model) == 1.0
    assert metric.evaluate_model(qmodel.model) == 1.0 and len(seen) == 1
    assert metric.evaluate_model(model) == 2.0 and len(seen) == 2


def test_scores_of_an_analysis_are_journaled_by_the_outputs_scored():
    journal = Journal(None, "fp")
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
    journal = Journal(None, "fp")
    pooled, model_file = OutputMetric("sqnr"), JournaledMetric(ModelFunction(lambda p: 1.0), journal)
    assert analysis_metric(pooled, journal) is pooled and analysis_metric(model_file, journal) is model_file
    for metric in (OutputMetric("sqnr", output="y"), Top1Agreement(), OutputFunction(lambda o, r: 1.0)):
        wrapped = analysis_metric(metric, journal)
        assert isinstance(wrapped, JournaledScores) and wrapped.inner is metric
