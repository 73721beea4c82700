"""How many full evaluations a fallback search may need: the documented bounds and the default budgets.

For ``L`` ranked layers of which ``k`` must leave INT8 (the *culprits*), the ``"auto"`` strategy
makes at most

* ``ceil(log2(S)) + 1`` gallop evaluations over the ranked prefixes 1, 2, 4, ... up to
  ``S = ceil(share * L)`` layers;
* 1 evaluation of every layer out of INT8 (only when no prefix met the target);
* ``2k * ceil(log2(L / k)) + 2k`` group-testing evaluations (QuickXplain over ``L`` candidates;
  over the passing prefix, at most ``S``, when a prefix met the target);
* with the exchange phase (``SearchConfig(exchange=True)``, off by default), ``k - 1`` exchange
  evaluations when the ``k`` culprits are the only passing set: one per layer of the irreducible
  set (every other layer out of INT8) shows it essential; ``k - 1`` of them prove the set the
  smallest and end the exchange phase (:func:`~quantdbg.fallback.group.shrink`).

When other, smaller passing sets exist, the exchange phase looks for them with the budget left and
stops when a round finds none, so the search never makes more than its budget of evaluations.

The group-testing term is Junker's ``2k log2(L/k) + 2k`` with the logarithm rounded up: the
halves of an odd number of candidates are uneven, and without the rounding the count exceeds the
bound (e.g. 24 evaluations for ``L = 19, k = 3``, where ``2k log2(L/k) + 2k = 21.98``). With it,
the bound held for every culprit set of ``L <= 79`` and ``k <= 3`` and of ``L <= 40`` (and
``L = 64``) with ``k = 4``, checked exhaustively, and the property test checks it again.

The ranked strategies (``"bisect"``, ``"linear"``) keep their budget of ``floor(2 log2(L) + 2)``.
"""
from __future__ import annotations

import math

from quantdbg.errors import ConfigError
from quantdbg.fallback.plan import Strategy

EXCHANGE_DEFAULT = False
"""Whether the ``"auto"`` search runs the exchange phase unless told. Off, from measurements on
synthetic additive metrics (``benchmarks/exchange.py``: 52 layers with log-normal losses, a ranking
blurred by a log-normal factor, 40 seeds per setting): where a set could shrink (targets leaving 20
to 50 % of the loss), the phase made 24 to 31 more evaluations on top of the search's 13 to 45 and
removed 0.1 to 0.5 layers on average (a smaller set in 10 to 38 % of the runs); capped at the
search's own evaluations it kept about half of that gain on small sets for half the cost. Turn it
on (``SearchConfig(exchange=True)``) when one layer fewer is worth that many evaluations."""

GALLOP_SHARE = 0.25
"""Default share of the layers the ``"auto"`` strategy's gallop may keep out of INT8."""


def gallop_sizes(n_layers: int, share: float = GALLOP_SHARE) -> tuple[int, ...]:
    """The prefix sizes the ``"auto"`` strategy gallops over: 1, 2, 4, ... below ``S``, then ``S``.

    Args:
        n_layers: Ranked layers ``L`` (>= 1).
        share: ``S = ceil(share * L)`` (at least 1, at most ``L``).

    Returns:
        The sizes, ``ceil(log2(S)) + 1`` of them.
    """
    cap = min(n_layers, max(1, math.ceil(share * n_layers)))
    sizes, size = [], 1
    while size < cap:
        sizes.append(size)
        size *= 2
    return (*sizes, cap)


def group_testing_bound(n_layers: int, k: int) -> int:
    """``2k * ceil(log2(L / k)) + 2k``: QuickXplain's evaluations to find ``k`` culprits among ``L``.

    Raises:
        ConfigError: ``k`` is not in ``1..L``.
    """
    if not 1 <= k <= n_layers:
        raise ConfigError(f"The number of culprits k must be in 1..{n_layers} (the layers), got {k}.")
    return 2 * k * math.ceil(math.log2(n_layers / k)) + 2 * k


def search_bound(n_layers: int, k: int, share: float = GALLOP_SHARE) -> int:
    """The most full evaluations the ``"auto"`` strategy makes when ``k`` layers must leave INT8.

    The gallop, the all-layers check, group testing over every layer and the ``k - 1`` evaluations
    that prove the set the smallest (module docstring); the final verification is not counted.
    """
    return len(gallop_sizes(n_layers, share)) + 1 + group_testing_bound(n_layers, k) + k - 1


def planned_culprits(n_layers: int) -> int:
    """The ``k`` the default ``"auto"`` budget is sized for: ``max(4, ceil(L / 10))``, at most ``L``."""
    return min(n_layers, max(4, math.ceil(n_layers / 10)))


def default_budget(n_layers: int, strategy: Strategy = "bisect", share: float = GALLOP_SHARE) -> int:
    """The default number of search evaluations for ``L`` ranked layers.

    Args:
        n_layers: Ranked layers ``L``.
        strategy: ``"bisect"`` / ``"linear"``: ``floor(2 log2(L) + 2)`` (2 for ``L <= 1``);
            ``"auto"``: :func:`search_bound` for ``k = max(4, ceil(L / 10))`` culprits.
        share: The ``"auto"`` gallop's share of the layers.

    Returns:
        The budget (verification excluded).
    """
    if strategy == "auto":
        return search_bound(n_layers, planned_culprits(n_layers), share)
    return int(math.floor(2 * math.log2(n_layers) + 2)) if n_layers > 1 else 2


__all__ = ["EXCHANGE_DEFAULT", "GALLOP_SHARE", "default_budget", "gallop_sizes", "group_testing_bound",
           "planned_culprits", "search_bound"]
