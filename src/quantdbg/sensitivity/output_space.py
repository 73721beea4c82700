"""The output-space ranking: each layer alone in INT8, scored on what the task sees, over a few batches.

Local and cumulative modes rank a layer by its own error. A layer whose error is small but whose
outputs feed a threshold (class logits through a Sigmoid and a confidence cut) ranks last there,
although it flips decisions. Here each layer is quantized alone (isolated) on the first batches
holding ``output_samples`` samples -- ``L`` short passes of the switchable graph -- and scored by
the task metric when it runs in the session (output metrics, top-1 agreement, accuracy, output
functions), else (metrics that need a model file) by the SQNR of the model's outputs against FP32.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from quantdbg._json import Serializable
from quantdbg._progress import track
from quantdbg.errors import ConfigError
from quantdbg.evaluation import OutputMetric, TaskMetric
from quantdbg.execution import Executor
from quantdbg.sensitivity.evaluator import VariantEvaluator, VariantResult


@dataclass(frozen=True)
class OutputSpace(Serializable):
    """Output-space sensitivity: each layer alone in INT8, scored on the model's outputs.

    Attributes:
        metric: What ``values`` holds: the task metric's name, or ``"sqnr"`` (the outputs' SQNR in
            dB) when the task metric needs a model file.
        higher_is_better: Its direction.
        n_batches: Batches each variant ran on.
        n_samples: Samples in them.
        values: Layer -> the metric with only that layer in INT8.
        sqnr_db: Layer -> SQNR (dB) of the outputs against FP32 with only that layer in INT8.
        ranking: Layers, most sensitive first: the largest metric loss, then the lowest SQNR, then
            graph order (NaN values sink).
    """

    metric: str
    higher_is_better: bool
    n_batches: int
    n_samples: int
    values: Mapping[str, float]
    sqnr_db: Mapping[str, float]
    ranking: tuple[str, ...]

    def __post_init__(self) -> None:
        if len(set(self.ranking)) != len(self.ranking) or set(self.ranking) != set(self.values) \
                or set(self.ranking) != set(self.sqnr_db):
            raise ConfigError("OutputSpace.ranking must list each layer once, and values and sqnr_db hold "
                              f"exactly those layers; got {len(self.ranking)} ranked, {len(self.values)} "
                              f"values, {len(self.sqnr_db)} SQNRs.")


def _batch_metric(metric: TaskMetric, n_samples: int) -> TaskMetric:
    """The task metric on the first ``n_samples`` samples (the outputs' SQNR for model-file metrics)."""
    return OutputMetric("sqnr") if metric.needs_model else metric.on_first(n_samples)


def _loss(value: float, higher_is_better: bool) -> float:
    """Larger = more sensitive; NaN sinks."""
    if math.isnan(value):
        return -math.inf
    return -value if higher_is_better else value


def _score(evaluator: VariantEvaluator, layer: str, metric: TaskMetric, batches: int) -> VariantResult:
    outputs = evaluator.outputs([layer], batches)
    reference = evaluator.head_reference(batches)
    try:
        return evaluator.score(outputs, metric, reference)
    except Exception as err:  # a user metric that needs every sample: say which setting avoids it
        raise ConfigError(f"The output-space ranking scores {metric.name!r} on the first {len(reference)} "
                          f"batch(es) of the evaluation data, and it failed there ({type(err).__name__}: "
                          f"{err}). Set SensitivityConfig(output_samples=0) to skip the output-space "
                          "ranking, or a number >= the data's samples to score every sample.") from err


def _score_task(evaluator: VariantEvaluator, task: tuple[str, TaskMetric, int]) -> VariantResult:
    return _score(evaluator, *task)


def measure_output_space(evaluator: VariantEvaluator, samples: int, progress: bool = False,
                         executor: Executor | None = None) -> OutputSpace:
    """Quantizes each layer alone and scores the model's outputs on the first batches of the data.

    Args:
        evaluator: The models, data and task metric.
        samples: Each variant runs on the first batches holding at least this many samples
            (every batch when the data holds fewer).
        progress: Show a progress bar.
        executor: Runs the layers' variants as tasks (None: one after another, here); the values
            are the same.

    Returns:
        The output-space values and ranking.

    Raises:
        ConfigError: The task metric fails on the first batches alone.
    """
    reference = evaluator.head_reference(evaluator.batches_holding(samples))
    n_samples = evaluator.samples(len(reference))
    metric = _batch_metric(evaluator.metric, n_samples)
    if executor is None:
        results = {layer: _score(evaluator, layer, metric, len(reference))
                   for layer in track(evaluator.layers, desc="sensitivity (output space)", enabled=progress,
                                      unit="layer")}
    else:
        _ = evaluator.switch  # built once, before the workers get the evaluator
        tasks = [(layer, metric, len(reference)) for layer in evaluator.layers]
        found = executor.map(_score_task, tasks, shared=evaluator, desc="sensitivity (output space)",
                             progress=progress)
        results = dict(zip(evaluator.layers, found, strict=True))
    values = {layer: r.value for layer, r in results.items()}
    sqnr = {layer: math.nan if r.comparison is None else r.comparison.total.sqnr_db
            for layer, r in results.items()}
    order = {layer: i for i, layer in enumerate(evaluator.layers)}
    ranking = tuple(sorted(evaluator.layers, key=lambda n: (
        -_loss(values[n], metric.higher_is_better), math.inf if math.isnan(sqnr[n]) else sqnr[n], order[n])))
    return OutputSpace(metric.name, metric.higher_is_better, len(reference), n_samples, values, sqnr, ranking)


__all__ = ["OutputSpace", "measure_output_space"]
