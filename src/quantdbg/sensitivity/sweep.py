"""The ``isolated`` and ``leave-one-out`` modes: one full evaluation per layer.

Every variant is a feed to one session of the switchable graph; the FP32 reference outputs are
computed once, before any task. The variants run through the configured executor (``jobs`` local
processes, or e.g. a Ray cluster): each worker receives the evaluator once and keeps one session
for all its variants. Every finished variant is recorded in the journal as it arrives (by the
driver, wherever it ran), so an interrupted sweep resumes without the variants already done.
"""
from __future__ import annotations

import logging
from collections.abc import Sequence

from quantdbg._journal import EVALUATION, Journal
from quantdbg.evaluation import OutputMetrics
from quantdbg.execution import Executor, LocalExecutor
from quantdbg.sensitivity.config import Mode, SensitivityConfig
from quantdbg.sensitivity.measurement import Measurement
from quantdbg.variants.evaluator import VariantEvaluator, VariantResult

logger = logging.getLogger(__name__)

BASELINE = "__all_quantized__"
"""The variant name of the fully quantized model (evaluated first)."""


def variant_of(mode: Mode, layers: Sequence[str], name: str) -> tuple[str, ...]:
    """The quantized layers of variant ``name``: the layer alone (isolated), every other layer
    (leave-one-out), or every layer (:data:`BASELINE`)."""
    if name == BASELINE:
        return tuple(layers)
    return (name,) if mode == "isolated" else tuple(n for n in layers if n != name)


def executor_of(config: SensitivityConfig) -> Executor:
    """The configured executor, else ``config.jobs`` local processes."""
    return config.executor if config.executor is not None else LocalExecutor(config.jobs)


def measure_sweep(evaluator: VariantEvaluator, config: SensitivityConfig, journal: Journal) -> Measurement:
    """Evaluates the baseline and every layer's variant (those not already in ``journal``).

    Args:
        evaluator: The models, data and task metric.
        config: ``mode`` (isolated or leave-one-out), ``executor`` / ``jobs`` and ``progress``.
        journal: Where every new result is recorded as it arrives.

    Returns:
        The measurement: the task metric of each variant, signed so larger is more sensitive.
    """
    mode, layers = config.mode, evaluator.layers
    results = {n: VariantResult.from_dict(journal.get(key), f"{journal.where} entry {key!r}")
               for n in (BASELINE, *layers) if (key := _key(mode, n)) in journal}
    todo = [n for n in (BASELINE, *layers) if n not in results]
    if not evaluator.metric.needs_model:
        evaluator.reference()  # before any task: every worker reuses it
        _ = evaluator.switch

    def record(index: int, found: tuple[VariantResult, int]) -> None:
        result, passes = found
        evaluator.n_passes += passes
        results[todo[index]] = result
        journal.record(_key(mode, todo[index]), result.to_dict())

    executor_of(config).map(_run_variant, [(mode, n) for n in todo], shared=evaluator, on_result=record,
                            desc=f"sensitivity ({mode})", progress=config.progress)
    hib = evaluator.metric.higher_is_better
    sign = (-1.0 if hib else 1.0) * (1.0 if mode == "isolated" else -1.0)
    found = Measurement({n: sign * results[n].value for n in layers}, {n: results[n].value for n in layers},
                        {n: _total(results[n]) for n in layers},
                        baseline=results[BASELINE], metric_name=evaluator.metric.name, higher_is_better=hib)
    if not evaluator.metric.needs_model:
        found.reference_value = evaluator.reference_value()
    return found


def _key(mode: Mode, name: str) -> str:
    """The journal key of a sweep's variant (``name``: a layer or :data:`BASELINE`)."""
    return f"{EVALUATION}sweep:{mode}:{name}"


def _run_variant(evaluator: VariantEvaluator, task: tuple[Mode, str]) -> tuple[VariantResult, int]:
    """One variant's result and the passes it made (counted by the driver, wherever this ran)."""
    mode, name = task
    before = evaluator.n_passes
    result = evaluator.run(variant_of(mode, evaluator.layers, name))
    passes, evaluator.n_passes = evaluator.n_passes - before, before
    return result, passes


def _total(result: VariantResult) -> OutputMetrics | None:
    return None if result.comparison is None else result.comparison.total


__all__ = ["BASELINE", "executor_of", "measure_sweep", "variant_of"]
