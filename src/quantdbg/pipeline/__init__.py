"""The automatic flow: calibrate, repair INT8, rank, search the fewest layers to keep out of INT8,
verify and report, in one call (``quantdbg.auto(...)``, ``quantdbg auto``).

``config`` (:class:`AutoConfig`, the repair vocabulary) -> ``records`` (what the repairs decided) ->
``journal`` (finished passes and evaluations, the resume file) -> ``context`` (the data, metric and
models on the way) -> ``repairs`` (the INT8 repairs, each a pass with a frozen config and an
``apply``) -> ``recipe`` (the decisions as JSON, :func:`apply_recipe`) -> ``result``
(:class:`AutoResult`) -> ``flow`` (:func:`auto`).

``quantdbg.auto(model, calib, evals, target)`` is :func:`auto`; :func:`apply_recipe` re-applies a
recipe to a re-exported model.
"""
from __future__ import annotations

from quantdbg._exports import public_names as _public_names
from quantdbg.pipeline.config import (
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
from quantdbg.pipeline.context import AutoContext, Stage
from quantdbg.pipeline.flow import auto
from quantdbg.pipeline.journal import (
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
from quantdbg.pipeline.recipe import AutoRecipe, apply_recipe, read_recipe
from quantdbg.pipeline.records import ChannelRange, RepairRecord, SmoothingStep, TensorChoice
from quantdbg.pipeline.repairs import (
    REPAIR_PASSES,
    CalibratorRepair,
    Proposal,
    RepairPass,
    SmoothQuantRepair,
    with_per_tensor,
)
from quantdbg.pipeline.result import AutoResult

__all__ = _public_names(globals())
