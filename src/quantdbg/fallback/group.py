"""The ``"auto"`` strategy's phases: a short ranked gallop, group testing that ignores the ranking, exchanges.

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
4. **Exchanges** (:func:`shrink`, off by default:
   :data:`~quantdbg.fallback.budget.EXCHANGE_DEFAULT`): an irreducible set is
   not always the smallest (two alternative sets of culprits, layers that only help together); the
   budget left goes to smaller sets.

Every set is asked through the :class:`~quantdbg.fallback.ledger.Ledger`, so what monotonicity
already decides is never evaluated.
"""
from __future__ import annotations

import logging
import math
from collections.abc import Sequence

from quantdbg.fallback.budget import gallop_sizes
from quantdbg.fallback.config import SearchConfig
from quantdbg.fallback.ledger import BudgetExhausted, Ledger
from quantdbg.fallback.plan import Purpose

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


MAX_DROPPED = 3
"""The exchange phase drops two, then three layers of the set at a time. Larger drops rarely pay: on
synthetic additive metrics (52 layers, a noisy ranking) dropping up to every free layer found the
same sets at half again the evaluations (71 against 47 on average, budget included)."""


class _TooMany(Exception):
    """Group testing found more layers than the caller could use (caught in this module)."""


def quickxplain(ledger: Ledger, candidates: Sequence[str], base: frozenset[str] = frozenset(),
                purpose: Purpose = "group", limit: int | None = None) -> frozenset[str]:
    """An irreducible subset of ``candidates`` whose fallback, with ``base``, meets the target (QuickXplain).

    The caller has established (evaluated, or decided by monotonicity) that ``base`` and all
    ``candidates`` out of INT8 meet the target and that ``base`` alone does not.

    Args:
        ledger: The bookkeeping.
        candidates: Most preferred first; the result prefers early candidates.
        base: Layers kept out of INT8 throughout (none of them in ``candidates``).
        purpose: The phase its evaluations are logged under.
        limit: Give up (:class:`_TooMany`) as soon as the set would hold more than this many layers.

    Returns:
        The set (without ``base``): irreducible when the metric is monotone, and with ``base`` always
        a superset of a set seen to pass (QuickXplain keeps ``base | candidates`` passing at every
        step), so it needs no evaluation of its own.

    Raises:
        BudgetExhausted: The budget ran out first.
    """
    def explain(base: frozenset[str], tested: bool, part: tuple[str, ...]) -> frozenset[str]:
        # base out of INT8 is known to miss the target unless `tested` asks to check it again.
        if tested and ledger.met(base, purpose):
            return frozenset()
        if len(part) == 1:
            return frozenset(part)
        first, second = part[:len(part) // 2], part[len(part) // 2:]
        needed_second = _capped(explain(base | frozenset(first), True, second), limit)
        needed_first = explain(base | needed_second, bool(needed_second), first)
        return _capped(needed_first | needed_second, limit)

    return explain(base, False, tuple(candidates))


def _capped(found: frozenset[str], limit: int | None) -> frozenset[str]:
    if limit is not None and len(found) > limit:
        raise _TooMany
    return found


def shrink(ledger: Ledger, names: tuple[str, ...], chosen: frozenset[str]) -> frozenset[str]:
    """The exchange phase: from an irreducible passing set, smaller passing sets while the budget lasts.

    Each round (evaluations logged as ``"exchange"``):

    1. *Essential* layers: ``a`` is essential when every layer but ``a`` out of INT8 misses the
       target; every passing set then holds ``a``. As soon as at most one layer of the set can be
       other than essential, the set is a smallest one and the phase ends: at most ``k - 1``
       evaluations, the whole cost when the culprits are unique (as planted ones are), none for
       a set of one layer.
    2. *Exchanges*: the other layers, cheapest first (the loss each showed alone in INT8 in step 1,
       then least sensitive by rank); for ``j = 2`` then ``j = 3`` (:data:`MAX_DROPPED`) drop the
       ``j`` cheapest and look for fewer than ``j`` layers that replace them: QuickXplain over the
       layers outside the set with the dropped ones tried last (the set's layers in another order),
       given up as soon as it needs ``j``. ``j = 2`` trades two layers for one outside the set; when
       the set has three layers that are not essential, ``j = 3`` reruns QuickXplain with only the
       essential layers kept.

    The first smaller set found is made irreducible again (QuickXplain over it) and starts the next
    round; the phase ends when a round finds none or the budget runs out (the smallest irreducible
    set found so far is returned).

    Args:
        ledger: The bookkeeping; ``chosen`` and every layer out of INT8 are known to pass, none out
            of INT8 to fail.
        names: Every ranked layer, most sensitive first.
        chosen: An irreducible passing set (e.g. from :func:`quickxplain`).

    Returns:
        The smallest irreducible passing set found (``chosen`` itself when none is smaller).
    """
    while True:
        try:
            better = _smaller(ledger, names, chosen)
            if better is None:
                return chosen
            logger.info("fallback: exchange phase: %d layer(s) pass instead of %d", len(better), len(chosen))
            chosen = better
            chosen = quickxplain(ledger, ledger.ranked(chosen), purpose="exchange")
        except BudgetExhausted:
            logger.info("fallback: the budget ran out in the exchange phase at %d layer(s)", len(chosen))
            return chosen


def _smaller(ledger: Ledger, names: tuple[str, ...], chosen: frozenset[str]) -> frozenset[str] | None:
    """One round of :func:`shrink`: a smaller passing set, or None."""
    every = frozenset(names)
    essential: set[str] = set()
    for layer in ledger.ranked(chosen):
        if len(chosen) - len(essential) < 2:
            return None  # at most one layer is not essential: chosen is a smallest set (docstring)
        if not ledger.met(every - {layer}, "exchange"):
            essential.add(layer)
    free = _cheapest_first(ledger, every, [a for a in ledger.ranked(chosen) if a not in essential])
    outside = [n for n in names if n not in chosen]
    for size in range(2, min(len(free), MAX_DROPPED) + 1):
        dropped = free[:size]
        base = chosen - frozenset(dropped)
        try:
            return base | quickxplain(ledger, [*outside, *dropped], base, "exchange", size - 1)
        except _TooMany:
            continue
    return None


def _cheapest_first(ledger: Ledger, every: frozenset[str], free: list[str]) -> list[str]:
    """``free`` ordered by the loss each layer showed alone in INT8 (every other layer out of INT8, as
    step 1 of :func:`shrink` measured), smallest first; then least sensitive by rank."""
    top = ledger.value(every)

    def loss(layer: str) -> float:
        alone = ledger.value(every - {layer})
        if top is None or alone is None:
            return math.inf
        return (top - alone) if ledger.target.higher_is_better else (alone - top)

    return sorted(free, key=lambda a: (loss(a), -ledger.order[a]))


__all__ = ["MAX_DROPPED", "gallop", "quickxplain", "shrink"]
