"""Fallback: the smallest set of layers to keep out of INT8 so a target holds, and the mixed model.

``target`` (what must hold) -> ``search`` (gallop, bisect and prune over a ranking) -> ``plan`` (the
``quantdbg.fallback_plan/2`` document, with ModelOpt's and TensorRT's settings) -> ``mixed`` (the
mixed-precision model); ``auto`` chains ranking, search and verification on the real model.
"""
from quantdbg.fallback.auto import FallbackConfig, FallbackResult, auto_fallback
from quantdbg.fallback.mixed import write_mixed_model
from quantdbg.fallback.plan import (
    STRATEGIES,
    FallbackEvaluation,
    FallbackPlan,
    PlanStatus,
    Strategy,
    TensorRTSettings,
)
from quantdbg.fallback.search import default_budget, search_fallback
from quantdbg.fallback.target import TARGET_KINDS, FallbackTarget, TargetKind

__all__ = ["STRATEGIES", "TARGET_KINDS", "FallbackConfig", "FallbackEvaluation", "FallbackPlan",
           "FallbackResult", "FallbackTarget", "PlanStatus", "Strategy", "TargetKind", "TensorRTSettings",
           "auto_fallback", "default_budget", "search_fallback", "write_mixed_model"]
