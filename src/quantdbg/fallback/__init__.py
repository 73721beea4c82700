"""Fallback: the smallest set of layers to keep out of INT8 so a target holds, and the mixed model.

``target`` (what must hold) -> ``config`` (SearchConfig, FallbackConfig) -> ``search`` (the
strategies: ``ranked`` gallop/bisect/prune, or ``group`` testing after a short gallop, with the
``ledger`` counting every evaluation against the ``budget``) -> ``plan`` (the
``quantdbg.fallback_plan/2`` document, with ModelOpt's and TensorRT's settings) -> ``mixed`` (the
mixed-precision model); ``end_to_end`` chains ranking, search and verification on the real model.
"""
from quantdbg.fallback.config import FallbackConfig, SearchConfig
from quantdbg.fallback.end_to_end import FallbackResult, auto_fallback
from quantdbg.fallback.mixed import write_mixed_model
from quantdbg.fallback.plan import FallbackPlan
from quantdbg.fallback.search import search_fallback
from quantdbg.fallback.target import FallbackTarget

__all__ = [
    "FallbackConfig", "FallbackPlan", "FallbackResult", "FallbackTarget", "SearchConfig", "auto_fallback",
    "search_fallback", "write_mixed_model",
]
