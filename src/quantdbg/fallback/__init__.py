"""Fallback: the smallest set of layers to keep out of INT8 so a target holds, and the mixed model.

``target`` (what must hold) -> ``config`` (SearchConfig, FallbackConfig) -> ``search`` (the
strategies: ``ranked`` gallop/bisect/prune, or ``group`` testing after a short gallop, with the
``ledger`` counting every evaluation against the ``budget``) -> ``plan`` (the
``quantdbg.fallback_plan/2`` document, with ModelOpt's and TensorRT's settings) -> ``mixed`` (the
mixed-precision model); ``auto`` chains ranking, search and verification on the real model.
"""
from quantdbg._exports import public_names as _public_names
from quantdbg.fallback.auto import FallbackResult, auto_fallback
from quantdbg.fallback.budget import (
    GALLOP_SHARE,
    default_budget,
    gallop_sizes,
    group_testing_bound,
    planned_culprits,
    search_bound,
)
from quantdbg.fallback.config import FallbackConfig, SearchConfig
from quantdbg.fallback.mixed import write_mixed_model
from quantdbg.fallback.plan import (
    PLAN_STATUSES,
    PURPOSES,
    STRATEGIES,
    FallbackEvaluation,
    FallbackPlan,
    PlanStatus,
    Purpose,
    Strategy,
    TensorRTSettings,
)
from quantdbg.fallback.search import search_fallback
from quantdbg.fallback.target import TARGET_KINDS, FallbackTarget, TargetKind

__all__ = _public_names(globals())
