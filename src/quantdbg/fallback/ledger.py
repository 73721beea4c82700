"""The search's bookkeeping: every full evaluation, what monotonicity already decides, and the budget.

Every search strategy asks :meth:`Ledger.met` whether a set of layers kept out of INT8 meets the
target. A set is evaluated only when no earlier evaluation decides it: a subset of a failing set
fails and a superset of a passing set passes (excluding more never hurts). Each evaluation is
logged with its phase and counted against the budget; the verification is not.
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field

from quantdbg.fallback.plan import FallbackEvaluation, Purpose
from quantdbg.fallback.target import FallbackTarget

logger = logging.getLogger(__name__)


class BudgetExhausted(Exception):
    """The next evaluation would exceed the budget (caught by the search, never raised to callers)."""


@dataclass
class Ledger:
    """Evaluation bookkeeping: cache, monotone inference, budget.

    Attributes:
        evaluate: ``evaluate(exclude) -> value`` (a full evaluation).
        target: What must hold.
        order: Node -> its position in the ranking (sets are logged in this order).
        budget: Most evaluations (verification excluded).
        log: Every evaluation, in order.
        passing: Sets seen to meet the target.
        failing: Sets seen to miss it.
        marking: Mark each evaluation with its round (see :attr:`FallbackEvaluation.round`): a new
            round per evaluation, one round for those inside :meth:`shared_round`.
        evaluate_many: ``evaluate_many(sets) -> values``: evaluates independent sets at once (e.g.
            as tasks on several workers), for :meth:`prefetch`; None: one at a time.
    """

    evaluate: Callable[[frozenset[str]], float]
    target: FallbackTarget
    order: Mapping[str, int]
    budget: int
    log: list[FallbackEvaluation] = field(default_factory=list)
    passing: list[frozenset[str]] = field(default_factory=list)
    failing: list[frozenset[str]] = field(default_factory=list)
    marking: bool = False
    evaluate_many: Callable[[list[frozenset[str]]], list[float]] | None = None
    _ahead: dict[frozenset[str], float] = field(default_factory=dict, init=False, repr=False)
    _rounds: int = field(default=0, init=False, repr=False)
    _shared: int | None = field(default=None, init=False, repr=False)

    @property
    def n_search(self) -> int:
        """Evaluations made so far (verification excluded)."""
        return sum(1 for e in self.log if e.purpose != "verify")

    def known(self, exclude: frozenset[str]) -> bool | None:
        """Whether ``exclude`` meets the target as earlier evaluations decide it (None: undecided)."""
        if any(p <= exclude for p in self.passing):
            return True
        if any(exclude <= f for f in self.failing):
            return False
        return None

    def met(self, exclude: frozenset[str], purpose: Purpose) -> bool:
        """Whether ``exclude`` meets the target, evaluating it only when undecided.

        Raises:
            BudgetExhausted: It is undecided and the budget is spent.
        """
        known = self.known(exclude)
        if known is not None:
            return known
        if self.n_search >= self.budget:
            raise BudgetExhausted
        value = float(self._ahead.pop(exclude)) if exclude in self._ahead else float(self.evaluate(exclude))
        ok = self.target.is_met(value)
        (self.passing if ok else self.failing).append(exclude)
        self.log.append(FallbackEvaluation(self.ranked(exclude), value, ok, purpose, self._round()))
        logger.info("fallback %s evaluation %d/%d: %d node(s) kept out of INT8 -> %.6g (%s)", purpose,
                    self.n_search, self.budget, len(exclude), value, "met" if ok else "missed")
        return ok

    def prefetch(self, sets: Iterable[frozenset[str]]) -> None:
        """Evaluates at once the sets of a round the search may ask next, with ``evaluate_many``.

        Only sets no earlier evaluation decides are evaluated, at most as many as the budget has
        left; :meth:`met` then takes their values instead of evaluating, so the log, the budget and
        the plan are exactly those of asking one set at a time (a set the search never asks costs
        work, not budget).
        """
        if self.evaluate_many is None:
            return
        left = self.budget - self.n_search
        todo = [s for s in dict.fromkeys(sets) if self.known(s) is None and s not in self._ahead][:left]
        if len(todo) > 1:
            self._ahead.update(zip(todo, (float(v) for v in self.evaluate_many(todo)), strict=True))

    def _round(self) -> int | None:
        if not self.marking:
            return None
        if self._shared is not None:
            return self._shared
        self._rounds += 1
        return self._rounds

    @contextmanager
    def shared_round(self) -> Iterator[None]:
        """The evaluations made inside share one round (they do not depend on each other's results)."""
        if self.marking:
            self._rounds += 1
            self._shared = self._rounds
        try:
            yield
        finally:
            self._shared = None

    def verification(self, exclude: tuple[str, ...], value: float, met: bool) -> FallbackEvaluation:
        """The log entry of the final verification (marked with a round of its own when marking)."""
        return FallbackEvaluation(exclude, value, met, "verify", self._round())

    def value(self, exclude: frozenset[str]) -> float | None:
        """The value an evaluation of exactly ``exclude`` returned (None: not evaluated)."""
        ranked = self.ranked(exclude)
        return next((e.value for e in self.log if e.exclude == ranked and e.purpose != "verify"), None)

    def ranked(self, names: Iterable[str]) -> tuple[str, ...]:
        """``names`` in rank order."""
        return tuple(sorted(names, key=self.order.__getitem__))

    def best(self) -> FallbackEvaluation | None:
        """The evaluation with the best value (the first of equals), None before any."""
        best = None
        for e in self.log:
            if best is None or self.target.better(e.value, best.value):
                best = e
        return best

    def smallest_passing(self) -> frozenset[str] | None:
        """The smallest set seen to meet the target (the earliest of equal size), None before any."""
        return min(self.passing, key=len, default=None)


__all__ = ["BudgetExhausted", "Ledger"]
