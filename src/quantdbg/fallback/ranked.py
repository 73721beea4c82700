"""The ranked strategies: the shortest passing prefix of the ranking, then greedy pruning.

``"bisect"`` gallops over ranked prefixes (1, 2, 4, ... nodes) until the target holds, bisects
between the last failing and the first passing prefix, then greedily drops nodes from the set, least
sensitive first, while the target still holds. ``"linear"`` is the top-k baseline: prefixes 1, 2,
3, ... and no pruning. Both trust the ranking: when the culprits sit deep in it they need most of
the layers.
"""
from __future__ import annotations

from quantdbg.fallback.ledger import BudgetExhausted, Ledger
from quantdbg.fallback.plan import Strategy


def smallest_prefix(ledger: Ledger, names: tuple[str, ...], strategy: Strategy) -> int | None:
    """Length of the shortest passing prefix (assuming monotonicity), or None when none passes.

    Raises:
        BudgetExhausted: The budget ran out first.
    """
    total = len(names)
    prefix = lambda k: frozenset(names[:k])  # noqa: E731
    if strategy == "linear":
        for k in range(1, total + 1):
            if ledger.met(prefix(k), "search"):
                return 0 if k == 1 and ledger.met(prefix(0), "search") else k
        return None
    lo, k = 0, 1  # prefix(lo) is not known to pass; gallop 1, 2, 4, ... then bisect
    while not ledger.met(prefix(k), "search"):
        if k == total:
            return None
        lo, k = k, min(2 * k, total)
    hi = k
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if ledger.met(prefix(mid), "search"):
            hi = mid
        else:
            lo = mid
    if hi == 1 and ledger.met(prefix(0), "search"):
        return 0
    return hi


def prune(ledger: Ledger, chosen: frozenset[str]) -> tuple[frozenset[str], bool]:
    """Greedy pruning, least sensitive node first; returns the set and whether it is 1-minimal."""
    for node in sorted(chosen, key=ledger.order.__getitem__, reverse=True):
        try:
            if ledger.met(chosen - {node}, "prune"):
                chosen = chosen - {node}
        except BudgetExhausted:
            return chosen, all(ledger.known(chosen - {n}) is False for n in chosen)
    return chosen, True


__all__ = ["prune", "smallest_prefix"]
