"""The automatic flow: calibrate, repair INT8, rank, search the fewest layers to keep out of INT8,
verify and report, in one call (``quantdbg.auto(...)``, ``quantdbg auto``).

``config`` (:class:`AutoConfig`, the repair vocabulary) -> ``records`` (what the repairs decided) ->
``journal`` (finished passes and evaluations, the resume file) -> ``context`` (the data, metric and
models on the way) -> ``repairs`` (the INT8 repairs, each a pass with a frozen config and an
``apply``) -> ``recipe`` (the decisions as JSON, :func:`apply_recipe`) -> ``result``
(:class:`AutoResult`) -> ``flow`` (:func:`run_auto`).

The package itself is callable: ``quantdbg.auto(model, calib, evals, target)`` is
:func:`run_auto`, and ``quantdbg.auto.apply_recipe`` re-applies a recipe.
"""
from __future__ import annotations

import sys
import types
from typing import Any

from quantdbg.auto.config import (
    MET_OUTCOMES,
    OUTCOMES,
    PHASES,
    REPAIRS,
    AutoConfig,
    CalibratorRepairConfig,
    Outcome,
    Phase,
    Repair,
    SmoothQuantRepairConfig,
)
from quantdbg.auto.context import AutoContext, Stage
from quantdbg.auto.flow import run_auto
from quantdbg.auto.journal import (
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
from quantdbg.auto.recipe import AutoRecipe, apply_recipe, read_recipe
from quantdbg.auto.records import ChannelRange, RepairRecord, SmoothingStep, TensorChoice
from quantdbg.auto.repairs import (
    REPAIR_PASSES,
    CalibratorRepair,
    Proposal,
    RepairPass,
    SmoothQuantRepair,
    with_per_tensor,
)
from quantdbg.auto.result import AutoResult

__all__ = ["MET_OUTCOMES", "OUTCOMES", "PHASES", "REPAIRS", "REPAIR_PASSES", "AutoConfig", "AutoContext",
           "AutoProgress", "AutoRecipe", "AutoResult", "CalibratorRepair", "CalibratorRepairConfig",
           "ChannelRange", "EvaluationRecord", "Journal", "JournaledEvaluator", "JournaledMetric",
           "JournaledScores", "Outcome", "Phase", "Proposal", "Repair", "RepairPass", "RepairRecord",
           "SmoothQuantRepair", "SmoothQuantRepairConfig", "SmoothingStep", "Stage", "TensorChoice",
           "analysis_metric", "apply_recipe", "fingerprint", "model_key", "read_recipe", "run_auto",
           "with_per_tensor"]


class _CallableModule(types.ModuleType):
    """This package, callable: ``quantdbg.auto(...)`` is :func:`run_auto` (see its docstring)."""

    def __call__(self, *args: Any, **kwargs: Any) -> AutoResult:
        """Runs the automatic flow: ``quantdbg.auto(model, calib, evals, target, metric=..., config=...)``.

        See :func:`run_auto` for the arguments, the result and the errors.
        """
        return run_auto(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
