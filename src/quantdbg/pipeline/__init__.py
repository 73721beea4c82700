"""The automatic flow: calibrate, repair INT8, rank, search the fewest layers to keep out of INT8,
verify and report, in one call (``quantdbg.auto(...)``, ``quantdbg auto``).

``config`` (:class:`AutoConfig`, the repair vocabulary) -> ``records`` (what the repairs decided) ->
``context`` (the data, metric, the journal of finished passes and evaluations, and the
models on the way) -> ``repairs`` (the INT8 repairs, each a pass with a frozen config and an
``apply``) -> ``recipe`` (the decisions as JSON, :func:`apply_recipe`) -> ``result``
(:class:`AutoResult`) -> ``flow`` (:func:`auto`).

``quantdbg.auto(model, calib, evals, target)`` is :func:`auto`; :func:`apply_recipe` re-applies a
recipe to a re-exported model.
"""
from quantdbg.pipeline.config import (
    AutoConfig,
    BiasCorrectionRepairConfig,
    CalibratorRepairConfig,
    EqualizeRepairConfig,
    SmoothQuantRepairConfig,
)
from quantdbg.pipeline.flow import auto
from quantdbg.pipeline.recipe import AutoRecipe, apply_recipe, read_recipe
from quantdbg.pipeline.result import AutoResult

__all__ = [
    "AutoConfig", "AutoRecipe", "AutoResult", "BiasCorrectionRepairConfig", "CalibratorRepairConfig",
    "EqualizeRepairConfig", "SmoothQuantRepairConfig", "apply_recipe", "auto", "read_recipe",
]
