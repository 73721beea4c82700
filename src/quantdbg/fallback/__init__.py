"""Fallback: the smallest set of layers to keep out of INT8 so a target holds, and the mixed model.

``target`` (what must hold) -> ``config`` (SearchConfig, FallbackConfig) -> ``search`` (the
strategies: ``ranked`` gallop/bisect/prune, or ``group`` testing after a short gallop, with the
``ledger`` counting every evaluation against the ``budget``) -> ``plan`` (the
``quantdbg.fallback_plan/2`` document, with ModelOpt's and TensorRT's settings) -> ``mixed`` (the
mixed-precision model); ``end_to_end`` chains ranking, search and verification on the real model.
"""
from quantdbg._exports import public_names as _public_names
from quantdbg.fallback.budget import GALLOP_SHARE as GALLOP_SHARE
from quantdbg.fallback.budget import default_budget as default_budget
from quantdbg.fallback.budget import gallop_sizes as gallop_sizes
from quantdbg.fallback.budget import group_testing_bound as group_testing_bound
from quantdbg.fallback.budget import planned_culprits as planned_culprits
from quantdbg.fallback.budget import search_bound as search_bound
from quantdbg.fallback.config import FallbackConfig as FallbackConfig
from quantdbg.fallback.config import SearchConfig as SearchConfig
from quantdbg.fallback.end_to_end import FallbackResult as FallbackResult
from quantdbg.fallback.end_to_end import auto_fallback as auto_fallback
from quantdbg.fallback.end_to_end import fallback_ingredients as fallback_ingredients
from quantdbg.fallback.mixed import write_mixed_model as write_mixed_model
from quantdbg.fallback.plan import PLAN_STATUSES as PLAN_STATUSES
from quantdbg.fallback.plan import PURPOSES as PURPOSES
from quantdbg.fallback.plan import STRATEGIES as STRATEGIES
from quantdbg.fallback.plan import FallbackEvaluation as FallbackEvaluation
from quantdbg.fallback.plan import FallbackPlan as FallbackPlan
from quantdbg.fallback.plan import PlanStatus as PlanStatus
from quantdbg.fallback.plan import Purpose as Purpose
from quantdbg.fallback.plan import Strategy as Strategy
from quantdbg.fallback.plan import TensorRTSettings as TensorRTSettings
from quantdbg.fallback.search import search_fallback as search_fallback
from quantdbg.fallback.target import TARGET_KINDS as TARGET_KINDS
from quantdbg.fallback.target import FallbackTarget as FallbackTarget
from quantdbg.fallback.target import TargetKind as TargetKind

__all__ = _public_names(globals())
