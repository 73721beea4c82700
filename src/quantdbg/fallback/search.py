"""Search for the smallest set of layers to keep out of INT8 (FP16 fallback).

Every call of the user's ``evaluate`` is a *full evaluation*: it is counted, logged with its phase
(``search``, ``group``, ``exchange``, ``prune``; the final ``verify`` is not counted), and never made when
monotonicity already decides it (a subset of a failing set fails, a superset of a passing set
passes). Three strategies:

* ``"auto"`` (default) does not trust the ranking. It gallops over the ranked prefixes 1, 2, 4, ...
  only up to a share ``s`` of the ``L`` layers (default 25 %, ``S = ceil(s * L)``); when none meets
  the target it evaluates every layer out of INT8 once (if even that misses, the target is
  unreachable) and then finds an irreducible set by adaptive group testing (QuickXplain) over the
  candidates, most sensitive first (:mod:`quantdbg.fallback.group`). An irreducible set need not be
  the smallest: the exchange phase (``SearchConfig(exchange=True)``; off by default, its evaluations
  rarely pay) then spends the budget left on smaller ones (drop two, then three layers of the set
  and look for fewer to replace them) until a round finds none. When ``k`` layers must leave INT8
  and no other set passes it needs at most
  ``ceil(log2(S)) + 1 + 1 + 2k * ceil(log2(L / k)) + 2k + k - 1`` evaluations, wherever the ``k`` sit
  in the ranking (:mod:`quantdbg.fallback.budget`). Its default budget is that bound for
  ``k = max(4, ceil(L / 10))``; when the budget runs out, the smallest passing set seen is the
  answer (status ``"budget_exhausted"``, with numbers). It walks the report's fused
  ranking (mode and output-space rankings, :attr:`~quantdbg.sensitivity.SensitivityReport.
  fused_ranking`).
* ``"bisect"`` gallops over the ranked prefixes until the target holds, bisects, then greedily
  prunes (:mod:`quantdbg.fallback.ranked`); budget ``floor(2 log2(L) + 2)``. It walks the mode's
  ranking.
* ``"linear"``: the top-k baseline (prefixes 1, 2, 3, ..., no pruning).

The final set is verified once more (by default on the real mixed-precision model).
"""
from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence

from quantdbg.errors import ConfigError
from quantdbg.execution import Executor
from quantdbg.fallback.config import SearchConfig
from quantdbg.fallback.group import gallop, quickxplain, shrink
from quantdbg.fallback.ledger import BudgetExhausted, Ledger
from quantdbg.fallback.plan import FallbackPlan, PlanStatus, Strategy, phase_counts
from quantdbg.fallback.ranked import prune, smallest_prefix
from quantdbg.fallback.target import FallbackTarget
from quantdbg.sensitivity import SensitivityReport

Score = Callable[[frozenset[str]], float]
"""``score(exclude) -> value``: the metric with the ``exclude`` layers kept out of INT8."""


def _ranking_names(ranking: SensitivityReport | Sequence[str], strategy: Strategy) -> tuple[str, ...]:
    if isinstance(ranking, Sequence):
        names = tuple(ranking)
    else:
        names = ranking.fused_ranking if strategy == "auto" else ranking.ranking
    if not names:
        raise ConfigError("The ranking is empty: there are no quantized layers to fall back.")
    if len(set(names)) != len(names):
        dup = next(n for n in names if names.count(n) > 1)
        raise ConfigError(f"The ranking lists node {dup!r} twice; give each layer once, most "
                          "sensitive first.")
    return names


def _config(strategy: Strategy | SearchConfig, max_evaluations: int | None) -> SearchConfig:
    if isinstance(strategy, SearchConfig):
        if max_evaluations is not None:
            raise ConfigError("Give the budget once: in the SearchConfig (max_evaluations=...) or as "
                              "max_evaluations, not both.")
        return strategy
    if max_evaluations is not None and max_evaluations < 1:
        raise ConfigError(f"max_evaluations must be >= 1, got {max_evaluations}.")
    return SearchConfig(strategy, None if max_evaluations is None else int(max_evaluations))


def search_fallback(ranking: SensitivityReport | Sequence[str], evaluate: Score, target: FallbackTarget,
                    strategy: Strategy | SearchConfig = "auto", *, max_evaluations: int | None = None,
                    verify: Score | None = None) -> FallbackPlan:
    """Finds a small set of layers whose fallback out of INT8 meets ``target``.

    Args:
        ranking: A :class:`~quantdbg.sensitivity.SensitivityReport` (``"auto"`` walks its fused
            ranking, the others its mode's ranking) or node names, most sensitive first.
        evaluate: ``evaluate(exclude) -> value``: the metric of the model with the ``exclude``
            nodes kept out of INT8 and every other ranked node quantized (a full evaluation).
            Assumed monotone: excluding more never hurts.
        target: What must hold (its ``kind`` says how ``value`` is read).
        strategy: ``"auto"``, ``"bisect"`` or ``"linear"`` (module docstring), or a
            :class:`~quantdbg.fallback.config.SearchConfig` with the strategy's settings.
        max_evaluations: Budget of search evaluations (default: the strategy's,
            :func:`~quantdbg.fallback.budget.default_budget`).
        verify: Scores the final set once more, e.g. on the real mixed-precision model (default:
            ``evaluate`` again).

    Returns:
        The plan (status ``"unreachable"`` with the best value seen when even the whole ranking
        out of INT8 misses the target; ``"budget_exhausted"`` with the smallest passing set seen
        when ``"auto"`` ran out of budget before that set was minimal).

    Raises:
        ConfigError: Empty or duplicated ranking, unknown strategy, a budget < 1 (or given twice),
            or a relative-loss target without its reference.
    """
    config = _config(strategy, max_evaluations)
    names = _ranking_names(ranking, config.strategy)
    if target.kind == "relative_loss" and target.reference is None:
        target.relative_loss(0.0)  # raises the ConfigError that explains the missing reference
    many = None if config.executor is None else functools.partial(_evaluate_many, config.executor, evaluate)
    ledger = Ledger(evaluate, target, {n: i for i, n in enumerate(names)}, config.budget(len(names)),
                    marking=config.strategy == "auto", evaluate_many=many)
    if config.strategy == "auto":
        return _gallop_then_group(ledger, names, config, verify or evaluate)
    try:
        k = smallest_prefix(ledger, names, config.strategy)
    except BudgetExhausted:
        k = None
    if k is None:
        return _unreachable(ledger, names, config.strategy)
    chosen, minimal = frozenset(names[:k]), False
    if config.strategy == "bisect":
        chosen, minimal = prune(ledger, chosen)
    return _verified(ledger, names, chosen, minimal, config.strategy, verify or evaluate)


def _evaluate_many(executor: Executor, evaluate: Score, sets: list[frozenset[str]]) -> list[float]:
    return executor.map(_evaluate_one, sets, shared=evaluate, desc="fallback search round")


def _evaluate_one(evaluate: Score, exclude: frozenset[str]) -> float:
    return float(evaluate(exclude))


def _gallop_then_group(ledger: Ledger, names: tuple[str, ...], config: SearchConfig,
                       verify: Score) -> FallbackPlan:
    """Gallop up to the share, else every layer out of INT8; then group testing (module docstring)."""
    try:
        size = gallop(ledger, names, config)
        if size == 1:  # the top layer alone meets the target: perhaps INT8 already does
            chosen = frozenset() if ledger.met(frozenset(), "search") else frozenset(names[:1])
            return _verified(ledger, names, chosen, True, "auto", verify)
        if size is None and not ledger.met(frozenset(names), "search"):
            return _unreachable(ledger, names, "auto")
        chosen = quickxplain(ledger, names[:size])
        if config.exchange:
            chosen = shrink(ledger, names, chosen)
    except BudgetExhausted:
        return _exhausted(ledger, names, verify)
    minimal = all(ledger.known(chosen - {n}) is False for n in chosen)
    return _verified(ledger, names, chosen, minimal, "auto", verify)


def _exhausted(ledger: Ledger, names: tuple[str, ...], verify: Score) -> FallbackPlan:
    """The budget ran out: the smallest passing set seen (unreachable when none passed)."""
    passing = ledger.smallest_passing()
    if passing is None:
        return _unreachable(ledger, names, "auto")
    smaller = [len(f) for f in ledger.failing if len(f) < len(passing)]
    value = ledger.value(passing)
    note = (f"The budget of {ledger.budget} evaluations ran out before the set was minimal: no evaluated set "
            f"of <= {max(smaller, default=0)} layers met {ledger.target.describe()}; best: {len(passing)} "
            f"layers -> {math.nan if value is None else value:.6g}.")
    return _verified(ledger, names, passing, False, "auto", verify, note=note, status="budget_exhausted")


def _unreachable(ledger: Ledger, names: tuple[str, ...], strategy: Strategy) -> FallbackPlan:
    best = ledger.best()
    value = math.nan if best is None else best.value
    exclude = names if best is None else best.exclude
    exhausted = not any(e.exclude == names for e in ledger.log)
    tried = "set" if strategy == "auto" else "prefix"
    why = (f"the budget of {ledger.budget} evaluations ran out before any {tried} met the target"
           if exhausted else f"even all {len(names)} ranked nodes out of INT8 miss it")
    message = f"Target {ledger.target.describe()} is unreachable: {why}; best achieved {value:.6g} " \
              f"with {len(exclude)} node(s) out of INT8."
    return FallbackPlan("unreachable", exclude, ledger.target, value, strategy, names, tuple(ledger.log),
                        ledger.budget, False, message=message)


def _counts(ledger: Ledger, strategy: Strategy) -> str:
    phases = phase_counts(ledger.log)
    if strategy != "auto" or not phases:
        return f"{ledger.n_search} evaluations"
    return " + ".join(f"{n} {phase}" for phase, n in phases.items()) + " evaluations"


def _verified(ledger: Ledger, names: tuple[str, ...], chosen: frozenset[str], minimal: bool,
              strategy: Strategy, verify: Score, *, note: str = "",
              status: PlanStatus = "met") -> FallbackPlan:
    counts = _counts(ledger, strategy)
    value = float(verify(chosen))
    ok = ledger.target.is_met(value)
    exclude = ledger.ranked(chosen)
    ledger.log.append(ledger.verification(exclude, value, ok))
    if not ok:
        status = "verification_failed"
        message = (f"The search's set of {len(exclude)} node(s) passed, but the verification run gave "
                   f"{value:.6g}, which misses {ledger.target.describe()}; the evaluation used in the search "
                   "differs from the verified model (e.g. FP16 vs FP32 fallback): add margin to the target.")
    elif status == "budget_exhausted":
        message = f"{note} Verified value {value:.6g} ({counts} + 1 verification)."
    else:
        message = (f"{len(exclude)} of {len(names)} node(s) out of INT8 meet {ledger.target.describe()} "
                   f"(verified value {value:.6g}, {counts} + 1 verification).{note}")
    return FallbackPlan(status, exclude, ledger.target, value, strategy, names, tuple(ledger.log),
                        ledger.budget, minimal, message=message)


__all__ = ["Score", "search_fallback"]
