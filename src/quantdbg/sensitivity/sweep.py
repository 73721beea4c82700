"""The ``isolated`` and ``leave-one-out`` modes: one full evaluation per layer.

Every variant is a feed to one session of the switchable graph; the FP32 reference outputs are
computed once. ``jobs > 1`` spreads the variants over forked processes, each with its own session;
every finished variant is recorded in the results file, so an interrupted sweep resumes.
"""
from __future__ import annotations

import logging
import multiprocessing
from collections.abc import Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from typing import Any

from quantdbg._progress import track
from quantdbg.evaluation import OutputMetrics
from quantdbg.sensitivity.config import Mode, SensitivityConfig
from quantdbg.sensitivity.evaluator import VariantEvaluator, VariantResult
from quantdbg.sensitivity.measurement import Measurement
from quantdbg.sensitivity.resume import ResultsFile

logger = logging.getLogger(__name__)

BASELINE = "__all_quantized__"
"""The variant name of the fully quantized model (evaluated first)."""


def variant_of(mode: Mode, layers: Sequence[str], name: str) -> tuple[str, ...]:
    """The quantized layers of variant ``name``: the layer alone (isolated), every other layer
    (leave-one-out), or every layer (:data:`BASELINE`)."""
    if name == BASELINE:
        return tuple(layers)
    return (name,) if mode == "isolated" else tuple(n for n in layers if n != name)


def measure_sweep(evaluator: VariantEvaluator, config: SensitivityConfig, state: ResultsFile) -> Measurement:
    """Evaluates the baseline and every layer's variant (those not already in ``state``).

    Args:
        evaluator: The models, data and task metric.
        config: ``mode`` (isolated or leave-one-out), ``jobs`` and ``progress``.
        state: The results file; every new result is recorded there.

    Returns:
        The measurement: the task metric of each variant, signed so larger is more sensitive.
    """
    mode, layers = config.mode, evaluator.layers
    todo = [n for n in (BASELINE, *layers) if n not in state.done]
    if not evaluator.metric.needs_model:
        evaluator.reference()  # before any fork: workers inherit it
    results = dict(state.done)
    items = _evaluate_parallel(evaluator, mode, todo, config.jobs) if config.jobs > 1 and len(todo) > 1 \
        else ((n, evaluator.run(variant_of(mode, layers, n))) for n in todo)
    for name, result in track(items, total=len(todo), desc=f"sensitivity ({mode})", enabled=config.progress,
                              unit="variant"):
        results[name] = result
        state.record(name, result)
    hib = evaluator.metric.higher_is_better
    sign = (-1.0 if hib else 1.0) * (1.0 if mode == "isolated" else -1.0)
    found = Measurement({n: sign * results[n].value for n in layers}, {n: results[n].value for n in layers},
                        {n: _total(results[n]) for n in layers},
                        baseline=results[BASELINE], metric_name=evaluator.metric.name, higher_is_better=hib)
    if not evaluator.metric.needs_model:
        found.reference_value = evaluator.reference_value()
    return found


def _total(result: VariantResult) -> OutputMetrics | None:
    return None if result.comparison is None else result.comparison.total


_WORKER: dict[str, Any] = {}


def _worker_init() -> None:
    _WORKER["evaluator"].detach()  # the inherited session belongs to the parent


def _worker_run(mode: Mode, name: str) -> tuple[str, dict[str, Any]]:
    evaluator: VariantEvaluator = _WORKER["evaluator"]
    return name, evaluator.run(variant_of(mode, evaluator.layers, name)).to_dict()


def _evaluate_parallel(evaluator: VariantEvaluator, mode: Mode, names: Sequence[str],
                       jobs: int) -> Iterable[tuple[str, VariantResult]]:
    """Evaluates variants in ``jobs`` forked processes, each with its own session."""
    if "fork" not in multiprocessing.get_all_start_methods():
        logger.warning("jobs=%d needs the 'fork' start method, absent here; evaluating serially.", jobs)
        for name in names:
            yield name, evaluator.run(variant_of(mode, evaluator.layers, name))
        return
    _WORKER["evaluator"] = evaluator
    try:
        context = multiprocessing.get_context("fork")
        with ProcessPoolExecutor(jobs, mp_context=context, initializer=_worker_init) as pool:
            futures = [pool.submit(_worker_run, mode, name) for name in names]
            for future in as_completed(futures):
                name, result = future.result()
                yield name, VariantResult.from_dict(result)
    finally:
        _WORKER.clear()


__all__ = ["BASELINE", "measure_sweep", "variant_of"]
