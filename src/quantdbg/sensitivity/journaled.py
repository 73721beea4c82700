"""Evaluations through the journal (:mod:`quantdbg._journal`): each variant, model or set of outputs
is scored once per run, however often it is asked for and however often the run is resumed.

:class:`JournaledEvaluator` keys its in-session evaluations by the Q/DQ model and the quantized
layers (``run``) or by the model's bytes (``run_model``, ``reference_value``); a model-file metric
(a command) becomes a :class:`JournaledMetric`, keyed by the bytes of each model it scores, whoever
asks (the repairs, the fallback search, its verification); :class:`JournaledScores` keys the
task-metric scores a sensitivity analysis makes by the outputs scored. Every key names the metric
too, so two metrics of one run never share an entry.
"""
from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

from quantdbg._fingerprint import digest, feeds_digest
from quantdbg._journal import EVALUATION, Journal
from quantdbg._json import Serializable
from quantdbg.backends import RunnerFactory
from quantdbg.data import DataSource
from quantdbg.evaluation import Comparison, OutputMetric, TaskMetric
from quantdbg.evaluation.metrics import MetricName
from quantdbg.evaluation.task import as_task_metric
from quantdbg.model.external import model_bytes
from quantdbg.model.load import ModelSource
from quantdbg.qdq import QuantizedModel
from quantdbg.sensitivity.evaluator import VariantEvaluator, VariantResult


def model_key(model: onnx.ModelProto) -> str:
    """The digest of a model's bytes (what a pass over it or an evaluation of it is stored under)."""
    return digest(*model_bytes(model))


@dataclass(frozen=True)
class EvaluationRecord(Serializable):
    """One task-metric evaluation in a journal.

    Attributes:
        phase: The phase of the run that made it (empty outside the automatic flow).
        value: The task metric.
        comparison: Outputs against FP32 (in-session metrics; None for model-file metrics).
    """

    phase: str
    value: float
    comparison: Comparison | None = None


def evaluation(journal: Journal, key: str, compute: Callable[[], VariantResult]) -> VariantResult:
    """The evaluation recorded under ``key``, else ``compute()`` made (in the journal's phase) and recorded.

    Args:
        journal: Where evaluations are kept.
        key: What is evaluated (prefixed with :data:`quantdbg._journal.EVALUATION` here).
        compute: Makes the evaluation.
    """
    key = f"{EVALUATION}{key}"

    def make() -> EvaluationRecord:
        result = compute()
        return EvaluationRecord(journal.phase, result.value, result.comparison)

    record = journal.stored(key, make, EvaluationRecord.to_dict, EvaluationRecord.from_dict)
    journal.used.setdefault(key, record.phase)
    return VariantResult(record.comparison, record.value)


class _Journaled(TaskMetric):
    """A task metric whose evaluations go through a journal: it names, directs, describes and
    identifies itself as the metric it wraps.

    Args:
        inner: The metric.
        journal: Where evaluations are kept.
    """

    identity_attrs = ("inner",)

    def __init__(self, inner: TaskMetric, journal: Journal) -> None:
        self.inner = inner
        self.journal = journal
        self.name = inner.name
        self.higher_is_better = inner.higher_is_better
        self.key = digest(inner.identity())

    def describe(self) -> str:
        """The inner metric's description."""
        return self.inner.describe()

    def on_first(self, n_samples: int) -> TaskMetric:
        """The inner metric on the first ``n_samples`` samples, through the same journal."""
        inner = self.inner.on_first(n_samples)
        return self if inner is self.inner else type(self)(inner, self.journal)

    def ingredients(self) -> dict[str, str]:
        """The inner metric's ingredients."""
        return self.inner.ingredients()


class JournaledMetric(_Journaled):
    """A model-file task metric (e.g. a command) whose evaluations go through a journal, keyed by the
    model's bytes.

    Args:
        inner: The metric (``needs_model``).
        journal: Where evaluations are kept.
    """

    needs_model = True

    def from_model(self, path: Path) -> float:
        """The inner metric of the model at ``path`` (not journaled: :meth:`evaluate_model` is)."""
        return self.inner.from_model(path)

    def evaluate_model(self, model: onnx.ModelProto) -> float:
        """The inner metric of ``model``, from the journal when this model was evaluated before."""
        compute = lambda: VariantResult(None, self.inner.evaluate_model(model))  # noqa: E731
        return evaluation(self.journal, f"model:{self.key}:{model_key(model)}", compute).value


def _outputs_digest(outputs: Mapping[str, np.ndarray]) -> str:
    return feeds_digest([outputs])


class JournaledScores(_Journaled):
    """An in-session task metric whose scores go through a journal, keyed by the outputs scored.

    For the evaluations a sensitivity analysis makes with the task metric (its variants are not
    named to the caller): a resumed run scores no outputs twice.

    Args:
        inner: The metric (computed from outputs).
        journal: Where evaluations are kept.
    """

    def from_outputs(self, outputs: Mapping[str, np.ndarray], reference: Mapping[str, np.ndarray]) -> float:
        """The inner metric of ``outputs``, from the journal when these outputs were scored before."""
        key = f"outputs:{self.key}:{_outputs_digest(outputs)}:{_outputs_digest(reference)}"
        compute = lambda: VariantResult(None, self.inner.from_outputs(outputs, reference))  # noqa: E731
        return evaluation(self.journal, key, compute).value


def analysis_metric(metric: TaskMetric, journal: Journal) -> TaskMetric:
    """The task metric a journaled sensitivity analysis gets: journaled when it runs the user's code.

    A model-file metric is already a :class:`JournaledMetric`; an output-difference metric pooled
    over every output is computed by the evaluator itself and stays as it is (its value must not
    change); any other in-session metric becomes a :class:`JournaledScores`.
    """
    if metric.needs_model or (isinstance(metric, OutputMetric) and metric.output is None):
        return metric
    return JournaledScores(metric, journal)


class JournaledEvaluator(VariantEvaluator):
    """A :class:`~quantdbg.sensitivity.VariantEvaluator` whose evaluations go through a journal.

    In-session evaluations are keyed by the Q/DQ model and the quantized layers (``run``) or by the
    model's bytes (``run_model``); a model-file metric is wrapped in a :class:`JournaledMetric`
    (unless it is one), which keys its own evaluations. Sent to a worker process, it travels as a
    plain evaluator: only the run's own process writes the journal.

    Args:
        fp_model: The FP32 model.
        qmodel: The Q/DQ model and its records.
        data: Evaluation data.
        metric: The task metric.
        runner_factory: Makes the runners (None: ONNX Runtime on the CPU).
        journal: Where evaluations are kept.
    """

    def __init__(self, fp_model: ModelSource, qmodel: QuantizedModel, data: DataSource,
                 metric: TaskMetric | MetricName, runner_factory: RunnerFactory | None = None, *,
                 journal: Journal) -> None:
        metric = as_task_metric(metric)
        if metric.needs_model and not isinstance(metric, JournaledMetric):
            metric = JournaledMetric(metric, journal)
        super().__init__(fp_model, qmodel, data, metric, runner_factory)
        self.journal = journal
        self._key = ""

    def _variant_key(self, what: str, model: onnx.ModelProto, extra: str = "") -> str:
        if not self._key:
            self._key = digest(self.metric.identity())
        return f"{what}:{self._key}:{model_key(model)}{extra}"

    def run(self, quantized: Collection[str]) -> VariantResult:
        """:meth:`VariantEvaluator.run`, from the journal when this variant was evaluated before."""
        if self.metric.needs_model:
            return super().run(quantized)
        key = self._variant_key("variant", self.qmodel.model, f":{digest(*sorted(quantized))}")
        return evaluation(self.journal, key, lambda: super(JournaledEvaluator, self).run(quantized))

    def run_model(self, model: onnx.ModelProto) -> VariantResult:
        """:meth:`VariantEvaluator.run_model`, from the journal when this model was evaluated before."""
        if self.metric.needs_model:
            return super().run_model(model)
        return evaluation(self.journal, self._variant_key("model", model),
                          lambda: super(JournaledEvaluator, self).run_model(model))

    def reference_value(self) -> float:
        """:meth:`VariantEvaluator.reference_value`, from the journal when evaluated before."""
        if self.metric.needs_model:
            return super().reference_value()
        compute = lambda: VariantResult(None, super(JournaledEvaluator, self).reference_value())  # noqa: E731
        return evaluation(self.journal, self._variant_key("reference", self.fp_model), compute).value

    def with_metric(self, metric: TaskMetric | MetricName) -> VariantEvaluator:
        """An evaluator of the same models, data and runners scored by ``metric``, on the same journal."""
        return JournaledEvaluator(self.fp_model, self.qmodel, self.data, metric, self.runner_factory,
                                  journal=self.journal)


__all__ = ["EvaluationRecord", "JournaledEvaluator", "JournaledMetric", "JournaledScores", "analysis_metric",
           "evaluation", "model_key"]
