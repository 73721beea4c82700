"""Passes over the evaluation data that read only in-graph error reductions.

The local and paired graphs (:mod:`quantdbg.sensitivity.graphs`) return, per compared tensor, the
scalars of :data:`~quantdbg.sensitivity.graphs.REDUCTIONS`; this module runs such a graph over the
data, adds the per-batch float32 sums in float64 and turns them into output metrics.
"""
from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Generic, TypeVar

import numpy as np
import onnx

from quantdbg._progress import track
from quantdbg.evaluation import OutputMetrics
from quantdbg.evaluation.metrics import metrics_from_sums
from quantdbg.sensitivity.clone_groups import clone_groups
from quantdbg.sensitivity.graphs import LocalVariant, local_graph
from quantdbg.variants.evaluator import VariantEvaluator

_SUMS = 5  # signal, noise, test, max_abs, count
K = TypeVar("K", bound=Hashable)


@dataclass(frozen=True)
class DataPass:
    """One pass of a graph over the evaluation data.

    Attributes:
        desc: Progress-bar label.
        progress: Show a progress bar.
        max_batches: Stop after this many batches (None: all).
        also: Further outputs kept per batch (e.g. the models' outputs).
    """

    desc: str
    progress: bool = False
    max_batches: int | None = None
    also: tuple[str, ...] = ()


@dataclass(frozen=True)
class Reduced(Generic[K]):
    """What :func:`reduce_outputs` returns.

    Attributes:
        sums: Group -> [signal, noise, test, max_abs, count] over the pass.
        kept: Per batch, the outputs named in :attr:`DataPass.also`.
    """

    sums: dict[K, list[float]]
    kept: list[dict[str, np.ndarray]]


def sums_to_metrics(sums: Sequence[float]) -> OutputMetrics:
    """Output metrics from [signal, noise, test, max_abs, count] (``sum r*t`` recovered)."""
    signal, noise, test, max_abs, count = sums
    return metrics_from_sums(signal, noise, (signal + test - noise) / 2.0, test, max_abs, int(count))


def reduce_outputs(evaluator: VariantEvaluator, model: onnx.ModelProto,
                   groups: Mapping[K, tuple[str, ...]], run: DataPass) -> Reduced[K]:
    """Runs ``model`` over the evaluator's data and accumulates each group's reductions.

    Args:
        evaluator: Holds the data and the runner factory (its pass count is increased).
        model: A graph whose outputs include every name of ``groups``.
        groups: Key -> the names of its :data:`~quantdbg.sensitivity.graphs.REDUCTIONS`.
        run: The pass.

    Returns:
        The float64 sums per group and the kept outputs.
    """
    names = [n for outs in groups.values() for n in outs]
    totals: dict[K, list[float]] = {key: [0.0] * _SUMS for key in groups}
    kept: list[dict[str, np.ndarray]] = []
    with evaluator.runner_factory(model) as runner:
        evaluator.n_passes += 1
        total = getattr(evaluator.data, "num_batches", None)
        if total is not None and run.max_batches is not None:
            total = min(total, run.max_batches)  # the bar ends where the pass stops
        for index, feed in enumerate(track(evaluator.data, total=total, desc=run.desc, enabled=run.progress)):
            if run.max_batches is not None and index >= run.max_batches:
                break
            values = runner.infer(feed, [*names, *run.also])
            for key, outs in groups.items():
                _add_batch(totals[key], [float(values[n]) for n in outs])
            if run.also:
                kept.append({n: values[n] for n in run.also})
    return Reduced(totals, kept)


def _add_batch(sums: list[float], batch: list[float]) -> None:
    sums[0] += batch[0]
    sums[1] += batch[1]
    sums[2] += batch[2]
    peak = max(abs(batch[3]), abs(batch[4]))
    sums[3] = max(sums[3], peak) if math.isfinite(peak) else math.inf
    sums[4] += batch[5]


def run_local_graph(evaluator: VariantEvaluator, variants: Sequence[LocalVariant],
                    run: DataPass) -> dict[int, OutputMetrics]:
    """Runs a local graph of ``variants``; returns variant index -> metrics of its clone's outputs.

    A layer with several outputs gets them pooled. The clones of a large model are split across
    sessions (:func:`~quantdbg.sensitivity.clone_groups.clone_groups`), each over the same
    batches; that still counts as one pass.
    """
    groups = clone_groups(evaluator.fp_model, evaluator.qmodel, variants)
    passes = evaluator.n_passes
    pooled: dict[int, list[float]] = {}
    for number, group in enumerate(groups, 1):
        graph = local_graph(evaluator.fp_model, evaluator.qmodel, [variants[i] for i in group])
        part = replace(run, desc=f"{run.desc} {number}/{len(groups)}") if len(groups) > 1 else run
        reduced = reduce_outputs(evaluator, graph.model, graph.outputs, part)
        for (variant, _), sums in reduced.sums.items():
            acc = pooled.setdefault(group[variant], [0.0] * _SUMS)
            for i in (0, 1, 2, 4):
                acc[i] += sums[i]
            acc[3] = max(acc[3], sums[3])
    evaluator.n_passes = passes + 1
    return {v: sums_to_metrics(pooled[v]) for v in sorted(pooled)}


__all__ = ["DataPass", "Reduced", "reduce_outputs", "run_local_graph", "sums_to_metrics"]
