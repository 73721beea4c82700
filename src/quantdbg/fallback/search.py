"""Search for the smallest set of layers to keep out of INT8 (FP16 fallback).

:func:`search_fallback` walks a sensitivity ranking: it gallops over ranked prefixes (1, 2, 4, ...
nodes) until the target holds, bisects between the last failing and the first passing prefix,
then greedily drops nodes from the set while the target still holds. Every call of the user's
``evaluate`` is a *full evaluation* and is counted; results that follow from monotonicity (a
subset of a failing set fails, a superset of a passing set passes) are never re-evaluated. The
default budget is ``floor(2 log2(L) + 2)`` evaluations for ``L`` ranked layers, plus one
verification of the final set (by default on the real mixed-precision model).
"""
from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from quantdbg.errors import ConfigError, check_choice
from quantdbg.fallback.plan import STRATEGIES, FallbackEvaluation, FallbackPlan, PlanStatus, Purpose, Strategy
from quantdbg.fallback.target import FallbackTarget
from quantdbg.sensitivity import SensitivityReport

logger = logging.getLogger(__name__)


def default_budget(n_layers: int) -> int:
    """``floor(2 log2(L) + 2)`` full evaluations for ``L`` ranked layers (2 for L <= 1)."""
    return int(math.floor(2 * math.log2(n_layers) + 2)) if n_layers > 1 else 2


class _BudgetExhausted(Exception):
    pass


@dataclass
class _Search:
    """Evaluation bookkeeping: cache, monotone inference, budget."""

    evaluate: Callable[[frozenset[str]], float]
    target: FallbackTarget
    order: Mapping[str, int]
    budget: int
    log: list[FallbackEvaluation] = field(default_factory=list)
    passing: list[frozenset[str]] = field(default_factory=list)
    failing: list[frozenset[str]] = field(default_factory=list)

    @property
    def n_search(self) -> int:
        return sum(1 for e in self.log if e.purpose != "verify")

    def known(self, exclude: frozenset[str]) -> bool | None:
        if any(p <= exclude for p in self.passing):
            return True
        if any(exclude <= f for f in self.failing):
            return False
        return None

    def met(self, exclude: frozenset[str], purpose: Purpose) -> bool:
        known = self.known(exclude)
        if known is not None:
            return known
        if self.n_search >= self.budget:
            raise _BudgetExhausted
        value = float(self.evaluate(exclude))
        ok = self.target.is_met(value)
        (self.passing if ok else self.failing).append(exclude)
        self.log.append(FallbackEvaluation(self.ranked(exclude), value, ok, purpose))
        logger.info("fallback: %d node(s) kept out of INT8 -> %.6g (%s)", len(exclude), value,
                    "met" if ok else "missed")
        return ok

    def ranked(self, names: Iterable[str]) -> tuple[str, ...]:
        return tuple(sorted(names, key=self.order.__getitem__))

    def best(self) -> FallbackEvaluation | None:
        best = None
        for e in self.log:
            if best is None or self.target.better(e.value, best.value):
                best = e
        return best


def _ranking_names(ranking: SensitivityReport | Sequence[str]) -> tuple[str, ...]:
    names = tuple(ranking) if isinstance(ranking, Sequence) else tuple(ranking.ranking)
    if not names:
        raise ConfigError("The ranking is empty: there are no quantized layers to fall back.")
    if len(set(names)) != len(names):
        dup = next(n for n in names if names.count(n) > 1)
        raise ConfigError(f"The ranking lists node {dup!r} twice; give each layer once, most "
                          "sensitive first.")
    return names


def _smallest_prefix(search: _Search, names: tuple[str, ...], strategy: Strategy) -> int | None:
    """Length of the shortest passing prefix (assuming monotonicity), or None when none passes."""
    total = len(names)
    prefix = lambda k: frozenset(names[:k])  # noqa: E731
    if strategy == "linear":
        for k in range(1, total + 1):
            if search.met(prefix(k), "search"):
                return 0 if k == 1 and search.met(prefix(0), "search") else k
        return None
    lo, k = 0, 1  # prefix(lo) is not known to pass; gallop 1, 2, 4, ... then bisect
    while not search.met(prefix(k), "search"):
        if k == total:
            return None
        lo, k = k, min(2 * k, total)
    hi = k
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if search.met(prefix(mid), "search"):
            hi = mid
        else:
            lo = mid
    if hi == 1 and search.met(prefix(0), "search"):
        return 0
    return hi


def _prune(search: _Search, chosen: frozenset[str]) -> tuple[frozenset[str], bool]:
    """Greedy pruning, least sensitive node first; returns the set and whether it is 1-minimal."""
    for node in sorted(chosen, key=search.order.__getitem__, reverse=True):
        try:
            if search.met(chosen - {node}, "prune"):
                chosen = chosen - {node}
        except _BudgetExhausted:
            return chosen, all(search.known(chosen - {n}) is False for n in chosen)
    return chosen, True


def search_fallback(ranking: SensitivityReport | Sequence[str],
                    evaluate: Callable[[frozenset[str]], float], target: FallbackTarget,
                    strategy: Strategy = "bisect", *, max_evaluations: int | None = None,
                    verify: Callable[[frozenset[str]], float] | None = None) -> FallbackPlan:
    """Finds a small set of layers whose fallback out of INT8 meets ``target``.

    Args:
        ranking: A :class:`~quantdbg.sensitivity.SensitivityReport` or node names, most
            sensitive first.
        evaluate: ``evaluate(exclude) -> value``: the metric of the model with the ``exclude``
            nodes kept out of INT8 and every other ranked node quantized (a full evaluation).
            Assumed monotone: excluding more never hurts.
        target: What must hold (its ``kind`` says how ``value`` is read).
        strategy: ``"bisect"`` (gallop + bisection over ranked prefixes, then greedy pruning) or
            ``"linear"`` (the top-k baseline: prefixes 1, 2, 3, ..., no pruning).
        max_evaluations: Budget of search evaluations (default :func:`default_budget`).
        verify: Scores the final set once more, e.g. on the real mixed-precision model (default:
            ``evaluate`` again).

    Returns:
        The plan (status ``"unreachable"`` with the best value seen when even the whole ranking
        out of INT8 misses the target).

    Raises:
        ConfigError: Empty or duplicated ranking, unknown strategy, a budget < 1, or a
            relative-loss target without its reference.
    """
    names = _ranking_names(ranking)
    check_choice("fallback strategy", strategy, STRATEGIES)
    if target.kind == "relative_loss" and target.reference is None:
        target.relative_loss(0.0)  # raises the ConfigError that explains the missing reference
    budget = default_budget(len(names)) if max_evaluations is None else int(max_evaluations)
    if budget < 1:
        raise ConfigError(f"max_evaluations must be >= 1, got {max_evaluations}.")
    search = _Search(evaluate, target, {n: i for i, n in enumerate(names)}, budget)
    try:
        k = _smallest_prefix(search, names, strategy)
    except _BudgetExhausted:
        k = None
    if k is None:
        return _unreachable(search, names, strategy)
    chosen, minimal = frozenset(names[:k]), False
    if strategy == "bisect":
        chosen, minimal = _prune(search, chosen)
    return _verified(search, names, chosen, minimal, strategy, verify or evaluate)


def _unreachable(search: _Search, names: tuple[str, ...], strategy: Strategy) -> FallbackPlan:
    best = search.best()
    value = math.nan if best is None else best.value
    exclude = names if best is None else best.exclude
    exhausted = not any(e.exclude == names for e in search.log)
    why = (f"the budget of {search.budget} evaluations ran out before any prefix met the target"
           if exhausted else f"even all {len(names)} ranked nodes out of INT8 miss it")
    message = f"Target {search.target.describe()} is unreachable: {why}; best achieved {value:.6g} " \
              f"with {len(exclude)} node(s) out of INT8."
    return FallbackPlan("unreachable", exclude, search.target, value, strategy, names, tuple(search.log),
                        search.budget, False, message=message)


def _verified(search: _Search, names: tuple[str, ...], chosen: frozenset[str], minimal: bool,
              strategy: Strategy, verify: Callable[[frozenset[str]], float]) -> FallbackPlan:
    value = float(verify(chosen))
    ok = search.target.is_met(value)
    exclude = search.ranked(chosen)
    search.log.append(FallbackEvaluation(exclude, value, ok, "verify"))
    status: PlanStatus = "met" if ok else "verification_failed"
    message = (f"{len(exclude)} of {len(names)} node(s) out of INT8 meet {search.target.describe()} "
               f"(verified value {value:.6g}, {search.n_search} evaluations + 1 verification)."
               if ok else f"The search's set of {len(exclude)} node(s) passed, but the verification run gave "
               f"{value:.6g}, which misses {search.target.describe()}; the evaluation used in the search "
               "differs from the verified model (e.g. FP16 vs FP32 fallback): add margin to the target.")
    return FallbackPlan(status, exclude, search.target, value, strategy, names, tuple(search.log),
                        search.budget, minimal, message=message)


__all__ = ["default_budget", "search_fallback"]
