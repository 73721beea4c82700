"""What the automatic flow returns: the metric at each step, the repairs, the ranking, the fallback plan,
the mixed model and the recipe, with a verdict whose first sentence gives the numbers."""
from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from types import MappingProxyType
from typing import Any

from quantdbg import _display, _json
from quantdbg._json import Serializable
from quantdbg.fallback import FallbackPlan, FallbackTarget
from quantdbg.fallback.plan import FallbackEvaluation
from quantdbg.pipeline.config import MET_OUTCOMES, Outcome, Phase
from quantdbg.pipeline.recipe import AutoRecipe
from quantdbg.pipeline.records import RepairRecord
from quantdbg.qdq import QuantizedModel
from quantdbg.sensitivity import SensitivityReport


@dataclass(frozen=True)
class _Fields:
    """The JSON fields of :class:`AutoResult` (everything but the model)."""

    outcome: Outcome
    target: FallbackTarget
    metric: str
    fp32_value: float
    int8_value: float
    repaired_value: float
    final_value: float
    n_layers: int
    max_fallback: int
    recipe: AutoRecipe
    evaluations: Mapping[Phase, int] = field(default_factory=dict)
    report: SensitivityReport | None = None
    plan: FallbackPlan | None = None
    seconds: float = 0.0


@_json.document("quantdbg.auto", 1)
@dataclass(frozen=True, repr=False)
class AutoResult(_display.Displayable, _Fields, Serializable):
    """The result of :func:`quantdbg.auto` (the ``quantdbg.auto/1`` document; ``quantdbg auto --plan``).

    Its JSON form holds every field but the model, plus the derived ``met``, ``message`` and
    ``exclude``; the ``recipe`` section re-applies with :func:`quantdbg.pipeline.apply_recipe`.

    Attributes:
        outcome: ``"int8"`` (the default INT8 model meets the target), ``"repaired"`` (the INT8 model
            meets it after the repairs kept), ``"fallback"`` (met with at most ``max_fallback``
            layers out of INT8), ``"spread"`` (only more layers than that meet it: the error is
            spread over the model), ``"unreachable"`` (no set the search tried meets it) or
            ``"verification_failed"`` (the search's set missed it on the real mixed model); in the
            last three the final model is the best set found within ``max_fallback``.
        target: The target (a relative-loss target with its FP32 reference).
        metric: The task metric's name.
        fp32_value: Task metric of the FP32 model.
        int8_value: Of the INT8 start: the default INT8 model, or the per-tensor calibrator choice when
            it became the start (its repair record says ``at_start``).
        repaired_value: Of the INT8 model after the repairs kept (= ``int8_value`` when none was).
        final_value: Of the final model (verified on the real mixed model when layers were excluded).
        n_layers: Quantized layers.
        max_fallback: The most layers the flow keeps out of INT8 (``AutoConfig.max_fallback_share``).
        recipe: The decisions, re-appliable to a re-exported model.
        evaluations: Phase -> task-metric evaluations (the sensitivity analysis counts its passes in
            ``report.n_passes``).
        report: The sensitivity ranking of the model the search started from (None when no analysis
            was needed).
        plan: The fallback search's plan (one with no layer excluded when no search was needed); its
            build holds the commands that build the final model's engine (``plan.commands``).
        seconds: Wall time of this run (a resumed run counts only its own part).
        model: The final model: mixed precision, or all INT8 (None when read from JSON).
    """

    model: QuantizedModel | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "evaluations", MappingProxyType(dict(self.evaluations)))

    @property
    def met(self) -> bool:
        """The final model meets the target."""
        return self.outcome in MET_OUTCOMES

    @property
    def exclude(self) -> tuple[str, ...]:
        """The layers kept out of INT8 in the final model."""
        return self.recipe.exclude

    @property
    def repairs(self) -> tuple[RepairRecord, ...]:
        """Every repair tried, in order, with its decision."""
        return self.recipe.repairs

    @property
    def n_evaluations(self) -> int:
        """Task-metric evaluations over every phase."""
        return sum(self.evaluations.values())

    @property
    def message(self) -> str:
        """The verdict: whether the target is met, with the numbers."""
        return _verdict(self)

    def located(self, model_path: str | os.PathLike, **files: str | os.PathLike) -> AutoResult:
        """The same result, its build commands naming the final model at ``model_path`` (where the
        caller saves :attr:`model`) and the engine beside it; ``files`` (``source``,
        ``calibration_data``) name the FP32 model and calibration data files for ModelOpt's command
        when the flow was given them in memory."""
        return self if self.plan is None else replace(self, plan=self.plan.located(model_path, **files))

    def __json_encode__(self) -> dict[str, Any]:
        own = _json.encode(_Fields(**{f.name: getattr(self, f.name) for f in fields(_Fields)}))
        return {**own, "met": self.met, "message": self.message, "exclude": list(self.exclude)}

    @classmethod
    def __json_decode__(cls, data: Any, where: str) -> AutoResult:
        form = _json.decode(_Fields, data, where)
        return _json.construct(cls, {f.name: getattr(form, f.name) for f in fields(_Fields)}, where)


def _value(result: AutoResult, value: float) -> str:
    text = f"{result.metric} {value:.4g}"
    if result.target.kind == "relative_loss" and result.target.reference is not None:
        text += f" (loss {result.target.relative_loss(value):.3g} %)"
    return text


def _final(result: AutoResult) -> str:
    """The final value, its loss and the values before it: ``acc 0.96 (loss 0.3 %; FP32 .., ...)``."""
    target, value = result.target, result.final_value
    loss = (f"loss {target.relative_loss(value):.3g} %; "
            if target.kind == "relative_loss" and target.reference is not None else "")
    repaired = f", repaired {result.repaired_value:.4g}" if result.recipe.kept_after_start else ""
    start = "INT8 with the calibrator per tensor" if result.recipe.start_choice else "default INT8"
    return (f"{result.metric} {value:.4g} ({loss}FP32 {result.fp32_value:.4g}, {start} "
            f"{result.int8_value:.4g}{repaired})")


def _best(plan: FallbackPlan, target: FallbackTarget) -> FallbackEvaluation | None:
    best = None
    for e in plan.evaluations:
        if e.purpose != "verify" and (best is None or target.better(e.value, best.value)):
            best = e
    return best


def _why_missed(result: AutoResult, plan: FallbackPlan) -> str:
    precision = result.recipe.precision.value
    if result.outcome == "spread":
        share = 100.0 * result.max_fallback / max(result.n_layers, 1)
        return (f"no small set of layers meets it, the error is spread over the model: the search needed "
                f"{len(plan.exclude)} of {result.n_layers} layers out of INT8 "
                f"({_value(result, plan.value)}), more than the limit of {result.max_fallback} "
                f"({share:.0f} %)")
    if result.outcome == "verification_failed":
        return (f"the search's set of {len(plan.exclude)} layer(s) met it in the search, but the real mixed "
                f"model ({precision}) gives {_value(result, plan.value)}")
    best = _best(plan, result.target)
    tried = "" if best is None else (f"; the best, {len(best.exclude)} layer(s) out of INT8, gives "
                                     f"{_value(result, best.value)}")
    return f"no set of layers the search tried meets it ({plan.n_evaluations} evaluations{tried})"


def _verdict(result: AutoResult) -> str:
    target, final = result.target.describe(), _final(result)
    n, k = result.n_layers, len(result.exclude)
    if result.outcome == "int8":
        return f"Default INT8 meets {target}: {final}; all {n} layers stay in INT8."
    if result.outcome == "repaired":
        how = "repaired by " + " + ".join(result.recipe.kept)
        if not result.recipe.kept_after_start:
            how = "with the calibrator per tensor"
        return f"INT8 {how} meets {target}: {final}; all {n} layers stay in INT8."
    share = 100.0 * k / max(n, 1)
    out = f"{k} of {n} layers ({share:.0f} %) out of INT8 in {result.recipe.precision.value}"
    if result.outcome == "fallback":
        return f"Met {target} with {out}: {final}."
    why = "no search was run" if result.plan is None else _why_missed(result, result.plan)
    return (f"Missed {target}: {why}. Stopped at the best set within the limit of {result.max_fallback}: "
            f"{out}, {final}.")


__all__ = ["AutoResult"]
