"""Fallback end to end, on the models: rank the layers, search the fewest to keep out of INT8, verify
on the real model, build the mixed model (:mod:`~quantdbg.fallback.search` is the search alone)."""
from __future__ import annotations

from contextlib import ExitStack
from dataclasses import dataclass, replace
from typing import Any

from quantdbg import _display, _json
from quantdbg._fingerprint import digest
from quantdbg._journal import canonical
from quantdbg._json import Serializable
from quantdbg.config import Precision
from quantdbg.errors import ConfigError
from quantdbg.evaluation import OutputMetric
from quantdbg.fallback.config import FallbackConfig
from quantdbg.fallback.mixed import mixed_model
from quantdbg.fallback.plan import FallbackPlan
from quantdbg.fallback.search import Score, search_fallback
from quantdbg.fallback.target import FallbackTarget
from quantdbg.model.footprint import footprint
from quantdbg.qdq import QuantizedModel
from quantdbg.sensitivity import SensitivityReport, VariantEvaluator
from quantdbg.sensitivity.analyze import analyze_variants


@dataclass(frozen=True, repr=False)
class FallbackResult(_display.Displayable, Serializable):
    """What :func:`auto_fallback` produced.

    Its JSON form holds the plan and the report (both with their format tags), not the model.

    Attributes:
        plan: The search's plan.
        report: The sensitivity report the search walked.
        mixed: The mixed-precision model (None when the target is unreachable, or read from JSON).
    """

    plan: FallbackPlan
    report: SensitivityReport
    mixed: QuantizedModel | None

    def __json_encode__(self) -> dict[str, Any]:
        return {"plan": _json.dump(self.plan), "report": _json.dump(self.report)}

    @classmethod
    def __json_decode__(cls, data: Any, where: str) -> FallbackResult:
        if not isinstance(data, dict) or "plan" not in data or "report" not in data:
            raise _json.fail(where, "an object with a plan and a report", data)
        return cls(_json.load(FallbackPlan, data["plan"], "plan"),
                   _json.load(SensitivityReport, data["report"], "report"), None)


_DEFAULT = FallbackConfig()


def auto_fallback(evaluator: VariantEvaluator, target: FallbackTarget, config: FallbackConfig = _DEFAULT, *,
                  report: SensitivityReport | None = None) -> FallbackResult:
    """Ranks the layers, searches the smallest set to keep out of INT8, and verifies it on the real model.

    Search evaluations feed the evaluator's switchable graph (one session, excluded layers exactly
    FP32); the verification runs the mixed model written by :func:`quantdbg.qdq.remove_qdq` in
    ``config.precision``. Model-file metrics (commands) get the mixed model in
    ``config.precision`` at every evaluation. Through a
    :class:`~quantdbg.sensitivity.journaled.JournaledEvaluator` (see :func:`fallback_ingredients`), the
    ranking and every evaluation are kept in its journal, so a stopped search resumes.

    Args:
        evaluator: The FP32 and fully quantized models, the evaluation data, the task metric and
            the runners (:class:`~quantdbg.sensitivity.VariantEvaluator`); an ``"sqnr"`` target
            always reads the output SQNR, the others read the evaluator's metric.
        target: What must hold; a relative-loss target without a reference gets the FP32 model's.
        config: Ranking and search settings.
        report: A sensitivity report to walk instead of computing one (same layers).

    Returns:
        The plan, the report and (unless unreachable) the mixed model.

    Raises:
        ConfigError: Inconsistent target and metric, or a report for other layers.
        ModelError: The models do not match their records.
    """
    with ExitStack() as stack:
        scorer = _scorer(evaluator, target, stack)
        if report is None:
            report = analyze_variants(scorer, config.sensitivity)
        elif set(report.ranking) != set(scorer.layers):
            raise ConfigError("The sensitivity report ranks other layers than the Q/DQ model holds; analyse "
                              "this model (or pass report=None).")
        if target.kind == "relative_loss" and target.reference is None:
            target = target.with_reference(scorer.reference_value())
        evaluate, verify = _scoring(scorer, config.precision)
        if config.executor is not None and not scorer.metric.needs_model:
            scorer.reference()  # before the workers get the scorer: they reuse it
            _ = scorer.switch
        plan = search_fallback(report, evaluate, target, config.search, verify=verify)
    plan = plan.with_precision(config.precision)
    unreachable = plan.status == "unreachable"
    mixed = None if unreachable else mixed_model(scorer.qmodel, plan.exclude, config.precision)
    plan = replace(plan, footprint=footprint(scorer.fp_model), metric=scorer.metric.name)
    return FallbackResult(plan, report, mixed)


def fallback_ingredients(evaluator: VariantEvaluator, target: FallbackTarget,
                         config: FallbackConfig = _DEFAULT,
                         report: SensitivityReport | None = None) -> dict[str, str]:
    """What decides the result of :func:`auto_fallback`, per ingredient, for the journal of a run that
    resumes: the evaluator's models, data and metric, the target, the settings and the report walked.
    """
    sensitivity = replace(config.sensitivity, progress=False, results_path=None)
    settings = replace(config, sensitivity=sensitivity).to_dict()
    found = evaluator.ingredients(sensitivity.mode)
    found.update(target=digest(canonical(target.to_dict())), settings=digest(canonical(settings)))
    if report is not None:
        found["report"] = digest(canonical(report.to_dict()))
    return found


def _scorer(evaluator: VariantEvaluator, target: FallbackTarget, stack: ExitStack) -> VariantEvaluator:
    """The evaluator the target reads: the output SQNR for an SQNR target, else the given one."""
    metric = evaluator.metric
    if target.kind == "sqnr":
        if isinstance(metric, OutputMetric) and metric.metric == "sqnr" and metric.output is None:
            return evaluator
        return stack.enter_context(evaluator.with_metric("sqnr"))
    if metric.higher_is_better == target.lower_is_better:
        direction = "lower" if metric.higher_is_better else "higher"
        raise ConfigError(f"The target says {direction} is better but metric {metric.name!r} is "
                          f"{'higher' if metric.higher_is_better else 'lower'}-is-better; make them agree.")
    return evaluator


def _scoring(scorer: VariantEvaluator, precision: Precision) -> tuple[Score, Score]:
    """``evaluate`` (the switchable graph, or the mixed model for model-file metrics) and ``verify``
    (the real mixed model) of the search; objects, not closures, so an executor's workers get them."""
    return _Evaluate(scorer, precision), _Verify(scorer, precision)


@dataclass(frozen=True)
class _Evaluate:
    scorer: VariantEvaluator
    precision: Precision

    def __call__(self, exclude: frozenset[str]) -> float:
        task, qmodel = self.scorer.metric, self.scorer.qmodel
        if task.needs_model:
            return task.evaluate_model(mixed_model(qmodel, exclude, self.precision).model)
        return self.scorer.run([n for n in self.scorer.layers if n not in exclude]).value


@dataclass(frozen=True)
class _Verify:
    scorer: VariantEvaluator
    precision: Precision

    def __call__(self, exclude: frozenset[str]) -> float:
        return self.scorer.run_model(mixed_model(self.scorer.qmodel, exclude, self.precision).model).value


__all__ = ["FallbackResult", "auto_fallback", "fallback_ingredients"]
