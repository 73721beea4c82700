"""Scoring variants of a Q/DQ model -- any subset of its layers quantized -- against FP32.

Variants are feeds to one session of the switchable graph (:func:`~quantdbg.sensitivity.graphs.
switch_graph`); the FP32 reference outputs are computed once. The sensitivity sweeps and the
fallback search share this evaluator.
"""
from __future__ import annotations

import itertools
from collections.abc import Collection, Mapping
from dataclasses import dataclass

import numpy as np
import onnx

from quantdbg._fingerprint import compose, digest, feeds_digest
from quantdbg._json import Serializable
from quantdbg.backends import OnnxrtRunnerFactory, OrtConfig, Runner, RunnerFactory
from quantdbg.config import Precision
from quantdbg.data import CalibrationData, DataSource, as_model_data
from quantdbg.errors import ModelError, unknown
from quantdbg.evaluation import Comparison, OutputMetric, TaskMetric
from quantdbg.evaluation.metrics import MetricAccumulator, MetricName
from quantdbg.evaluation.task import as_task_metric, concat_batches
from quantdbg.model.external import model_bytes
from quantdbg.model.load import ModelSource, as_loaded
from quantdbg.qdq import QuantizedModel, remove_qdq
from quantdbg.sensitivity.graphs import SwitchGraph, switch_graph


@dataclass(frozen=True)
class VariantResult(Serializable):
    """One full evaluation of a model variant.

    Attributes:
        comparison: Its outputs against FP32 (None for model-file task metrics).
        value: The task metric.
    """

    comparison: Comparison | None
    value: float


def default_runner_factory(threads: int = 0) -> RunnerFactory:
    """ONNX Runtime on the CPU with ``threads`` intra-op threads (0: all cores)."""
    return OnnxrtRunnerFactory(OrtConfig(intra_op_num_threads=threads))


def _check_layers(fp_model: onnx.ModelProto, qmodel: QuantizedModel) -> None:
    if not qmodel.records:
        raise ModelError("The Q/DQ model has no recorded Q/DQ pairs: nothing to analyse. Quantize it "
                         "with quantdbg.quantize() or read a quantized model with records_from_model().")
    nodes = {n.name: n.op_type for n in fp_model.graph.node}
    for layer in qmodel.layers:
        if layer not in nodes:
            err = unknown("node", layer, list(nodes))
            raise ModelError(f"Quantized node {layer!r} is not in the FP32 model; pass the FP32 original of "
                             f"the Q/DQ model. {err}")


class VariantEvaluator:
    """Scores variants of a Q/DQ model -- any subset of its layers quantized -- on fixed data.

    Variants are feeds to one session of the switchable graph; the FP32 reference outputs are
    computed once, on first need. Model-file task metrics instead get each variant written out
    (layers not quantized are restored to FP32 by :func:`quantdbg.qdq.remove_qdq`).

    Args:
        fp_model: The FP32 original (path or ModelProto).
        qmodel: The Q/DQ model and its records.
        data: Evaluation data (``.npz`` path, arrays, or feeds).
        metric: Task metric or output-metric name.
        runner_factory: Makes the runners (default: ONNX Runtime on the CPU).
    """

    def __init__(self, fp_model: ModelSource, qmodel: QuantizedModel, data: DataSource,
                 metric: TaskMetric | MetricName = "sqnr",
                 runner_factory: RunnerFactory | None = None) -> None:
        self.fp_model = as_loaded(fp_model).proto
        self.qmodel = qmodel
        _check_layers(self.fp_model, qmodel)
        self.metric = as_task_metric(metric)
        self.data: CalibrationData = as_model_data(data, self.fp_model)
        self.runner_factory = runner_factory or default_runner_factory()
        self.n_passes = 0
        self._switch: SwitchGraph | None = None
        self._runner: Runner | None = None
        self._reference: list[dict[str, np.ndarray]] | None = None
        self._head: list[dict[str, np.ndarray]] | None = None

    @property
    def layers(self) -> tuple[str, ...]:
        """Quantized layers, in graph order."""
        return self.qmodel.layers

    @property
    def switch(self) -> SwitchGraph:
        """The switchable graph (built on first use)."""
        if self._switch is None:
            self._switch = switch_graph(self.qmodel, self.fp_model)
        return self._switch

    def reference(self) -> list[dict[str, np.ndarray]]:
        """FP32 outputs per batch (one pass, then cached)."""
        if self._reference is None:
            self._reference = self._run_all(self.fp_model, {})
        return self._reference

    def head_reference(self, batches: int) -> list[dict[str, np.ndarray]]:
        """FP32 outputs of the first ``batches`` batches (from the full reference once it exists,
        else one short pass, cached; a short pass is not counted in :attr:`n_passes`)."""
        if self._reference is not None:
            return self._reference[:batches]
        if self._head is None or len(self._head) < batches:
            self._head = self._run_all(self.fp_model, {}, batches=batches)
        return self._head[:batches]

    def _run_all(self, model: onnx.ModelProto, extra: Mapping[str, np.ndarray], runner: Runner | None = None,
                 batches: int | None = None) -> list[dict[str, np.ndarray]]:
        own = runner is None
        if own:  # one session alive at a time: the switchable graph's is rebuilt when next needed
            self.close()
        runner = runner or self.runner_factory(model)
        try:
            runner.activate()
            if batches is None:
                self.n_passes += 1
            return [runner.infer({**feed, **extra}) for feed in itertools.islice(self.data, batches)]
        finally:
            if own:
                runner.deactivate()

    def _switch_runner(self) -> Runner:
        if self._runner is None:
            self._runner = self.runner_factory(self.switch.model)
        return self._runner

    def __reduce__(self) -> tuple[object, tuple[dict[str, object]]]:
        """Travels to a worker process as a plain evaluator without its session: each worker opens its
        own, and what a subclass adds (e.g. a journal of evaluations) stays with the driver."""
        state = {name: self.__dict__[name] for name in _TRAVELS}
        state["_runner"] = None
        return _plain_evaluator, (state,)

    def detach(self) -> None:
        """Forgets (without closing) the session; a forked worker then builds its own."""
        self._runner = None

    def close(self) -> None:
        """Frees the session."""
        if self._runner is not None:
            self._runner.deactivate()
            self._runner = None

    def __enter__(self) -> VariantEvaluator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def score(self, outputs: list[dict[str, np.ndarray]], metric: TaskMetric | None = None,
              reference: list[dict[str, np.ndarray]] | None = None) -> VariantResult:
        """Scores a variant's per-batch outputs against the FP32 reference.

        Args:
            outputs: The variant's outputs, per batch.
            metric: The task metric (default: the evaluator's).
            reference: The FP32 outputs of the same batches (default: the full reference).

        Returns:
            The output comparison and the metric's value.
        """
        metric = metric or self.metric
        reference = self.reference() if reference is None else reference
        acc = MetricAccumulator()
        for ref, out in zip(reference, outputs, strict=True):
            acc.update(ref, out)
        comparison = acc.result()
        if isinstance(metric, OutputMetric) and metric.output is None:
            value = comparison.total.value(metric.metric)
        else:
            value = metric.from_outputs(concat_batches(outputs), concat_batches(reference))
        return VariantResult(comparison, float(value))

    def _check_quantized(self, quantized: Collection[str]) -> None:
        unknown_layers = set(quantized) - set(self.layers)
        if unknown_layers:
            raise unknown("quantized layer", sorted(unknown_layers)[0], self.layers)

    def run(self, quantized: Collection[str]) -> VariantResult:
        """Evaluates the variant with exactly the layers in ``quantized`` in INT8.

        Raises:
            ModelError: A name is not a quantized layer.
        """
        self._check_quantized(quantized)
        if self.metric.needs_model:
            return VariantResult(None, self.metric.evaluate_model(self.variant_model(quantized)))
        self.reference()
        return self.score(self.outputs(quantized))

    def outputs(self, quantized: Collection[str], batches: int | None = None) -> list[dict[str, np.ndarray]]:
        """The switchable graph's outputs per batch with exactly ``quantized`` in INT8.

        Args:
            quantized: The layers in INT8.
            batches: Only the first ``batches`` batches (a short pass, not counted in :attr:`n_passes`).

        Raises:
            ModelError: A name is not a quantized layer.
        """
        self._check_quantized(quantized)
        return self._run_all(self.switch.model, self.switch.feed(quantized), self._switch_runner(), batches)

    def variant_model(self, quantized: Collection[str],
                      precision: Precision = Precision.FP32) -> onnx.ModelProto:
        """The Q/DQ model with only ``quantized`` layers in INT8, the others in ``precision``."""
        off = [layer for layer in self.layers if layer not in set(quantized)]
        return remove_qdq(self.qmodel, off, precision).model if off else self.qmodel.model

    def run_model(self, model: onnx.ModelProto) -> VariantResult:
        """Evaluates any model with the FP32 model's inputs/outputs (e.g. the real mixed model)."""
        if self.metric.needs_model:
            return VariantResult(None, self.metric.evaluate_model(model))
        self.reference()
        return self.score(self._run_all(model, {}))

    def reference_value(self) -> float:
        """The task metric of the FP32 model."""
        if self.metric.needs_model:
            self.n_passes += 1
            return self.metric.evaluate_model(self.fp_model)
        ref = concat_batches(self.reference())
        return float(self.metric.from_outputs(ref, ref))

    def with_metric(self, metric: TaskMetric | MetricName) -> VariantEvaluator:
        """An evaluator of the same models, data and runners scored by ``metric``."""
        return VariantEvaluator(self.fp_model, self.qmodel, self.data, metric, self.runner_factory)

    def ingredients(self, mode: str) -> dict[str, str]:
        """What decides the scores, per ingredient: both models (a lazy model's data files included),
        the data, the metric (:meth:`~quantdbg.evaluation.TaskMetric.ingredients`: its full identity
        and the files a command reads) and ``mode``."""
        models = digest(*model_bytes(self.qmodel.model), *model_bytes(self.fp_model))
        return {"models": models, "data": feeds_digest(self.data), **self.metric.ingredients(), "mode": mode}

    def fingerprint(self, mode: str) -> str:
        """:meth:`ingredients` as one line (what a report records)."""
        return compose(self.ingredients(mode))

    @property
    def n_samples(self) -> int:
        """Samples in the evaluation data (axis 0 of the first input, summed over batches)."""
        return self.samples()

    def samples(self, batches: int | None = None) -> int:
        """Samples in the first ``batches`` batches (None: every batch)."""
        return sum(_feed_samples(feed) for feed in itertools.islice(self.data, batches))

    def batches_holding(self, samples: int) -> int:
        """The fewest first batches holding at least ``samples`` samples (every batch when the data
        holds fewer)."""
        batches = seen = 0
        for feed in self.data:
            batches += 1
            seen += _feed_samples(feed)
            if seen >= samples:
                break
        return batches


_TRAVELS = ("fp_model", "qmodel", "metric", "data", "runner_factory", "n_passes", "_switch", "_runner",
            "_reference", "_head")
"""The attributes a :class:`VariantEvaluator` is made of (what a worker gets)."""


def _plain_evaluator(state: dict[str, object]) -> VariantEvaluator:
    evaluator = VariantEvaluator.__new__(VariantEvaluator)
    evaluator.__dict__.update(state)
    return evaluator


def _feed_samples(feed: Mapping[str, np.ndarray]) -> int:
    """Samples in a feed: axis 0 of its first input (1 for a scalar)."""
    return int(np.shape(next(iter(feed.values())))[0] or 1)


__all__ = ["VariantEvaluator", "VariantResult", "default_runner_factory"]
