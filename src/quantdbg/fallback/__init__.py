"""Fallback: the smallest set of layers to keep out of INT8 so a target holds, and the mixed model."""
from quantdbg.fallback.search import (
    FallbackConfig,
    FallbackPlan,
    FallbackResult,
    FallbackTarget,
    auto_fallback,
    default_budget,
    search_fallback,
    write_mixed_model,
)

__all__ = ["FallbackConfig", "FallbackPlan", "FallbackResult", "FallbackTarget", "auto_fallback",
           "default_budget", "search_fallback", "write_mixed_model"]
