"""The automatic flow: calibrate, repair INT8, rank, search the fewest layers to keep out of INT8, verify.

1. calibrate: the default calibration, with a histogram kept for every tensor (one pass, two when
   the default calibrator needs no histograms), and the default INT8 model; the INT8 start is the
   per-tensor calibrator choice instead when its outputs on the first samples are clearly closer to
   FP32 (:class:`~quantdbg.pipeline.config.CalibratorRepairConfig`, no task-metric evaluation);
2. evaluate the FP32 model and the INT8 start on the task metric;
3. repair: each repair of ``AutoConfig.repairs`` in turn (:mod:`quantdbg.pipeline.repairs`: the
   calibrator per tensor from the calibrator evidence alone, or the default calibration back when the
   choice was the INT8 start, bias correction, cross-layer
   equalization, SmoothQuant), each evaluated only where its cheap evidence says it can help and
   kept only when the task metric improves; stop as soon as the target holds;
4. rank: the sensitivity of the repaired model;
5. search: :func:`quantdbg.fallback.auto_fallback` from the repaired model, verified on the real
   mixed model; model-file metrics evaluate the real mixed model at every step, in-session
   metrics use the sensitivity session;
6. when only a set larger than ``AutoConfig.max_fallback_share`` of the layers meets the target
   (or none does), stop at the best set within that share, verified, and say so with the numbers.
"""
from __future__ import annotations

import logging
import math
import time
from collections import Counter
from dataclasses import replace

from quantdbg._fingerprint import digest, feeds_digest
from quantdbg._journal import Journal, canonical
from quantdbg.data import CalibrationData, DataSource, as_model_data
from quantdbg.errors import ConfigError
from quantdbg.evaluation import OutputMetric, TaskMetric
from quantdbg.evaluation.metrics import MetricName
from quantdbg.evaluation.task import as_task_metric
from quantdbg.fallback import FallbackResult, FallbackTarget, auto_fallback
from quantdbg.model import LoadedModel
from quantdbg.model.load import ModelSource, as_loaded
from quantdbg.pipeline.build import with_build
from quantdbg.pipeline.config import PHASES, AutoConfig, Outcome
from quantdbg.pipeline.context import AutoContext, Stage
from quantdbg.pipeline.recipe import AutoRecipe
from quantdbg.pipeline.records import RepairRecord
from quantdbg.pipeline.repairs import REPAIR_PASSES, CalibratorRepair, Proposal, RepairPass
from quantdbg.pipeline.result import AutoResult
from quantdbg.qdq import QuantizedModel, remove_qdq
from quantdbg.sensitivity.journaled import JournaledMetric, model_key
from quantdbg.variants import VariantEvaluator

logger = logging.getLogger(__name__)

_DEFAULT = AutoConfig()

Values = tuple[float, ...]
"""FP32, default INT8, repaired (and final) task-metric values."""


def auto(model: ModelSource, calib_data: DataSource, eval_data: DataSource, target: FallbackTarget, *,
         metric: TaskMetric | MetricName = "sqnr", config: AutoConfig = _DEFAULT) -> AutoResult:
    """Quantizes ``model`` to INT8, repairs it, and keeps the fewest layers out of INT8 to meet ``target``.

    Also available as ``quantdbg.auto(...)``; the steps are in the module docstring.

    Args:
        model: The FP32 model (path, ModelProto or LoadedModel; never modified).
        calib_data: Calibration data (``.npz`` path, arrays, or feeds).
        eval_data: Evaluation data for the task metric.
        target: What the final model must achieve; a relative-loss target without a reference
            gets the FP32 model's metric.
        metric: The task metric: an output-metric name, or a
            :class:`~quantdbg.evaluation.TaskMetric` (a command runs on the real model files).
            An SQNR target reads the output SQNR (leave ``"sqnr"``).
        config: Calibration, repairs, ranking, search, limits, progress and the resume file.

    Returns:
        The result: metric values, repairs, ranking, plan (with the commands that build the final
        model's engine, naming it ``MIXED.onnx`` until :meth:`AutoResult.located`), final model,
        recipe and verdict.

    Raises:
        ConfigError: The target and metric disagree, a relative-loss target meets an infinite
            FP32 metric, or the resume file belongs to another run (the message names what
            differs), was written by an older quantdbg or was changed after it was written.
        FormatError: The resume file is not a journal.
        ModelError: The model is invalid or already quantized.
        DataError: The data does not match the model.
        BackendError: ONNX Runtime or the evaluation command failed.
    """
    start = time.perf_counter()
    fp = as_loaded(model)
    calib = as_model_data(calib_data, fp.proto, config.batch_size)
    evals = as_model_data(eval_data, fp.proto, config.batch_size)
    task = _task_metric(metric, target)
    ingredients = _ingredients(fp, calib, evals, task, target, config)
    with Journal.open(config.resume_path, "auto", ingredients) as journal:
        if task.needs_model:
            task = JournaledMetric(task, journal)
        result = _Flow(AutoContext(calib, evals, task, config, journal), target).run(fp)
    result = with_build(result, model, calib_data, evals, config)
    logger.info("auto: %s", result.message)
    return replace(result, seconds=round(time.perf_counter() - start, 3))


def _ingredients(fp: LoadedModel, calib: CalibrationData, evals: CalibrationData, metric: TaskMetric,
                 target: FallbackTarget, config: AutoConfig) -> dict[str, str]:
    """What decides a run's result, per ingredient (a journal of another run is refused by them): the
    model, both data sets, the metric (with the files a command reads), the target and the settings."""
    if config.resume_path is None:
        return {}
    return {"model": model_key(fp.proto), "calibration data": feeds_digest(calib),
            "evaluation data": feeds_digest(evals), **metric.ingredients(),
            "target": digest(canonical(target.to_dict())),
            "settings": digest(canonical(config.settings().to_dict()))}


def _task_metric(metric: TaskMetric | MetricName, target: FallbackTarget) -> TaskMetric:
    task = as_task_metric(metric)
    if target.kind == "sqnr":
        if not (isinstance(task, OutputMetric) and task.metric == "sqnr" and task.output is None):
            raise ConfigError(f"An SQNR target judges the output SQNR, but the metric is {task.name!r}; "
                              "leave metric='sqnr', or give a metric target (FallbackTarget.min_metric or "
                              "max_relative_loss).")
    elif task.higher_is_better == target.lower_is_better:
        raise ConfigError(f"The target says {'lower' if target.lower_is_better else 'higher'} is better "
                          f"but metric {task.name!r} is {'higher' if task.higher_is_better else 'lower'}"
                          "-is-better; make them agree.")
    return task


class _Flow:
    """One run: the phases in order, sharing the context, the target and the repair records."""

    def __init__(self, context: AutoContext, target: FallbackTarget) -> None:
        self.context = context
        self.config = context.config
        self.target = target
        self.records: list[RepairRecord] = []

    def run(self, fp: LoadedModel) -> AutoResult:
        base = self.context.stage(fp, self.config.calib)
        start, chosen = self._start(base)
        with self.context.evaluator(start) as scorer:
            fp32, int8 = self._baseline(scorer, start)
            if chosen is not None:
                self.records.append(chosen.start_record(int8))
            stage, repaired = self._repair(scorer, start, int8)
        values = (fp32, int8, repaired)
        if self.target.is_met(repaired):
            outcome: Outcome = "int8" if stage is base else "repaired"
            return self._result(outcome, stage, (*values, repaired), (), stage.qmodel, None)
        return self._fallback(stage, values)

    def _start(self, base: Stage) -> tuple[Stage, Proposal | None]:
        """The INT8 start: the calibrator choice when its start gate passes (its proposal), else ``base``.
        No task-metric evaluation: the gate compares output SQNRs on the first samples."""
        if "calibrator" not in self.config.repairs:
            return base, None
        with self.context.in_phase("calibrator"):
            proposal = CalibratorRepair(self.config.calibrator).as_start(base, self.context)
        return (base, None) if proposal.stage is None else (proposal.stage, proposal)

    def _baseline(self, scorer: VariantEvaluator, base: Stage) -> tuple[float, float]:
        """The FP32 and default INT8 task metric (the target gets its FP32 reference)."""
        with self.context.in_phase("reference"):
            fp32 = scorer.reference_value()
        if self.target.kind == "relative_loss" and self.target.reference is None:
            if not math.isfinite(fp32):
                raise ConfigError(f"A relative-loss target needs a finite FP32 metric, but "
                                  f"{self.context.metric.name} of the FP32 model is {fp32}; give an absolute "
                                  "bound instead (FallbackTarget.min_metric, --min-metric).")
            self.target = self.target.with_reference(fp32)
        with self.context.in_phase("int8"):
            int8 = scorer.run_model(base.qmodel.model).value
        return fp32, int8

    def _repair(self, scorer: VariantEvaluator, stage: Stage, value: float) -> tuple[Stage, float]:
        """Tries each repair in turn; keeps those that improve the task metric, until the target holds."""
        for name in self.config.repairs:
            if self.target.is_met(value):
                break
            repair = REPAIR_PASSES[name](self.config)
            with self.context.in_phase(name):
                proposal = self._propose(repair, stage)
                if proposal.stage is None:
                    self.records.append(proposal.record(value))
                    continue
                after = scorer.run_model(proposal.stage.qmodel.model).value
            kept = self.target.better(after, value) and abs(after - value) > repair.min_improvement
            self.records.append(proposal.record(value, after, kept))
            if kept:
                stage, value = proposal.stage, after
                if name == "calibrator":  # the default calibration back: the start's choice is given up
                    self.records = [replace(r, kept=False) if r.at_start else r for r in self.records]
        return stage, value

    def _propose(self, repair: RepairPass, stage: Stage) -> Proposal:
        """The repair's proposal; once the calibrator choice made the INT8 start and the target was missed,
        the calibrator repair proposes the default calibration back (the start gate only predicted
        the choice was better: it is the one calibration left to try)."""
        if isinstance(repair, CalibratorRepair) and any(r.at_start for r in self.records):
            return repair.back_to_default(stage, self.context)
        return repair.apply(stage, self.context)

    def _fallback(self, stage: Stage, values: Values) -> AutoResult:
        """Ranks and searches from the repaired model; stops within the share limit."""
        report = self.context.analysis(stage)
        sensitivity = replace(self.config.fallback.sensitivity, progress=self.config.progress,
                              results_path=None)
        fallback = replace(self.config.fallback, sensitivity=sensitivity)
        with self.context.evaluator(stage) as evaluator:
            with self.context.in_phase("search"):
                found = auto_fallback(evaluator, self.target, fallback, report=report)
            outcome, exclude, final, model = self._within_limit(evaluator, stage, found, values[2])
        return self._result(outcome, stage, (*values, final), exclude, model, found)

    def _within_limit(self, evaluator: VariantEvaluator, stage: Stage, found: FallbackResult,
                      repaired: float) -> tuple[Outcome, tuple[str, ...], float, QuantizedModel]:
        """The search's set when small enough; else the best evaluated set within the limit, verified."""
        plan, limit = found.plan, self.config.fallback_limit(len(stage.qmodel.layers))
        if found.mixed is not None and self.target.is_met(plan.value) and len(plan.exclude) <= limit:
            return "fallback", plan.exclude, plan.value, found.mixed  # the plan's set, verified
        outcome: Outcome = "unreachable" if plan.status == "unreachable" else (
            "spread" if len(plan.exclude) > limit else "verification_failed")
        best = None
        for e in plan.evaluations:
            if e.purpose != "verify" and 0 < len(e.exclude) <= limit and (
                    best is None or self.target.better(e.value, best.value)):
                best = e
        if best is None:
            return outcome, (), repaired, stage.qmodel
        mixed = remove_qdq(stage.qmodel, best.exclude, self.config.fallback.precision)
        with self.context.in_phase("verify"):
            value = evaluator.run_model(mixed.model).value
        if self.target.is_met(value):
            return "fallback", best.exclude, value, mixed
        if not self.target.better(value, repaired):
            return outcome, (), repaired, stage.qmodel
        return outcome, best.exclude, value, mixed

    def _result(self, outcome: Outcome, stage: Stage, values: Values, exclude: tuple[str, ...],
                model: QuantizedModel, found: FallbackResult | None) -> AutoResult:
        recipe = AutoRecipe(stage.calib_config, self.config.quant, stage.smoothing, exclude,
                            self.config.fallback.precision, tuple(self.records))
        n_layers = len(stage.qmodel.layers)
        report = found.report if found is not None else self.context.last_report
        fp32, int8, repaired, final = values
        used = Counter(self.context.journal.used.values())
        counts = {phase: used[phase] for phase in PHASES if used[phase]}
        return AutoResult(outcome, self.target, self.context.metric.name, fp32, int8, repaired, final,
                          n_layers, self.config.fallback_limit(n_layers), recipe, counts, report,
                          None if found is None else found.plan, model=model)


__all__ = ["auto"]
