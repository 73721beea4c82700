"""The ``"auto"`` strategy's phases: a short ranked gallop, then group testing that ignores the ranking.

1. **Gallop** over the ranked prefixes 1, 2, 4, ... up to ``S = ceil(share * L)`` layers (one
   round: the prefixes do not depend on each other's results), optionally leaving early when the
   prefix value stops improving.
2. When no prefix met the target: every layer out of INT8, once. If even that misses, the target
   is unreachable.
3. **Group testing** over the candidates (the passing prefix, or every layer), most sensitive
   first: QuickXplain (U. Junker, "QuickXplain: Preferred Explanations and Relaxations for
   Over-Constrained Problems", AAAI 2004). It splits the candidates in halves, keeps the first half
   out of INT8 while it looks for what the second half must add, then minimises the first half
   given that; halves that add nothing are settled by one evaluation. It returns an irreducible
   set (dropping any one layer misses the target), and with the candidates in a good order the
   smallest one. For ``k`` culprits among ``L`` candidates it needs at most
   ``2k * ceil(log2(L / k)) + 2k`` evaluations (:func:`~quantdbg.fallback.budget.group_testing_bound`),
   whatever the culprits' ranks.

Every set is asked through the :class:`~quantdbg.fallback.ledger.Ledger`, so what monotonicity
already decides is never evaluated.
"""
from __future__ import annotations

import logging
from collections.abc import Sequence

from quantdbg.fallback.budget import gallop_sizes
from quantdbg.fallback.config import SearchConfig
from quantdbg.fallback.ledger import Ledger

logger = logging.getLogger(__name__)


def gallop(ledger: Ledger, names: tuple[str, ...], config: SearchConfig) -> int | None:
    """The first passing prefix size among :func:`~quantdbg.fallback.budget.gallop_sizes`.

    Args:
        ledger: The bookkeeping.
        names: The ranking, most sensitive first.
        config: ``gallop_share`` and ``patience``.

    Returns:
        The size, or None when no prefix up to the share met the target (or patience ran out).

    Raises:
        BudgetExhausted: The budget ran out first.
    """
    best: float | None = None
    stale = 0
    sizes = gallop_sizes(len(names), config.gallop_share)
    with ledger.shared_round():
        ledger.prefetch(frozenset(names[:size]) for size in sizes)  # the round's sets are independent
        for size in sizes:
            prefix = frozenset(names[:size])
            if ledger.met(prefix, "search"):
                return size
            value = ledger.value(prefix)
            if value is None or best is None or ledger.target.better(value, best):
                best, stale = (best if value is None else value), 0
                continue
            stale += 1
            if config.patience is not None and stale >= config.patience:
                logger.info("fallback: %d ranked prefixes in a row did not improve on %.6g; leaving the "
                            "gallop at %d of %d layers", stale, best, size, len(names))
                return None
    return None


def quickxplain(ledger: Ledger, candidates: Sequence[str]) -> frozenset[str]:
    """An irreducible subset of ``candidates`` whose fallback meets the target (QuickXplain).

    The caller has established (evaluated, or decided by monotonicity) that all ``candidates``
    out of INT8 meet the target and that none out of INT8 does not.

    Args:
        ledger: The bookkeeping (evaluations are logged as ``"group"``).
        candidates: Most sensitive first; the result prefers early candidates.

    Returns:
        The set: irreducible when the metric is monotone, and always a superset of a set seen to
        pass (QuickXplain keeps ``base | candidates`` passing at every step), so it needs no
        evaluation of its own.

    Raises:
        BudgetExhausted: The budget ran out first.
    """
    def explain(base: frozenset[str], tested: bool, part: tuple[str, ...]) -> frozenset[str]:
        # base out of INT8 is known to miss the target unless `tested` asks to check it again.
        if tested and ledger.met(base, "group"):
            return frozenset()
        if len(part) == 1:
            return frozenset(part)
        first, second = part[:len(part) // 2], part[len(part) // 2:]
        needed_second = explain(base | frozenset(first), True, second)
        needed_first = explain(base | needed_second, bool(needed_second), first)
        return needed_first | needed_second

    return explain(frozenset(), False, tuple(candidates))


__all__ = ["gallop", "quickxplain"]
