"""How the fallback search walks the layers (SearchConfig) and how the automatic flow ranks and searches
(FallbackConfig)."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from quantdbg._json import Serializable, transient
from quantdbg.config import Precision
from quantdbg.errors import ConfigError, check_choice
from quantdbg.execution import Executor
from quantdbg.fallback.budget import EXCHANGE_DEFAULT, GALLOP_SHARE, default_budget
from quantdbg.fallback.plan import STRATEGIES, Strategy
from quantdbg.sensitivity import SensitivityConfig


class _SearchSettings:
    """The search settings SearchConfig and FallbackConfig both hold, checked in one place (each
    dataclass declares the fields itself, so its JSON form and positional order stay its own)."""

    strategy: Strategy
    max_evaluations: int | None
    gallop_share: float
    patience: int | None
    exchange: bool

    def __post_init__(self) -> None:
        check_choice("fallback strategy", self.strategy, STRATEGIES)
        if self.max_evaluations is not None and self.max_evaluations < 1:
            raise ConfigError(f"max_evaluations must be >= 1 or None, got {self.max_evaluations}.")
        if not (math.isfinite(self.gallop_share) and 0.0 < self.gallop_share <= 1.0):
            raise ConfigError(f"gallop_share is the share of the layers the gallop may keep out of INT8, in "
                              f"(0, 1]; got {self.gallop_share}.")
        if self.patience is not None and self.patience < 1:
            raise ConfigError(f"patience must be >= 1 or None (walk every prefix up to the share), got "
                              f"{self.patience}.")


@dataclass(frozen=True)
class SearchConfig(_SearchSettings, Serializable):
    """How :func:`~quantdbg.fallback.search.search_fallback` walks the layers.

    Attributes:
        strategy: ``"auto"`` (ranked gallop up to ``gallop_share`` of the layers, then group
            testing that does not trust the ranking), ``"bisect"`` (gallop + bisection over ranked
            prefixes, then greedy pruning) or ``"linear"`` (prefixes 1, 2, 3, ..., no pruning).
        max_evaluations: Budget of search evaluations (None: :func:`~quantdbg.fallback.budget.
            default_budget` of the strategy).
        gallop_share: ``"auto"``: the largest ranked prefix tried, as a share of the layers.
        patience: ``"auto"``: leave the gallop after this many prefixes in a row that do not improve
            on the best earlier prefix's value (None: walk every prefix up to the share).
        exchange: ``"auto"``: after group testing, spend the budget left on smaller sets (the
            exchange phase, :func:`~quantdbg.fallback.group.shrink`). Off by default
            (:data:`~quantdbg.fallback.budget.EXCHANGE_DEFAULT`): on synthetic additive metrics it
            doubled or tripled the search's evaluations for 0.1 to 0.5 fewer layers on average.
        executor: Runs the independent evaluations of a round (the ``"auto"`` gallop's prefixes) as
            tasks; ``evaluate`` then travels to its workers, so it must pickle. The plan is the same
            as without one. None: one evaluation at a time, here. Not part of the JSON form.

    Raises:
        ConfigError: Unknown strategy, a budget below 1, a share outside (0, 1] or a patience below 1.
    """

    strategy: Strategy = "auto"
    max_evaluations: int | None = None
    gallop_share: float = GALLOP_SHARE
    patience: int | None = None
    exchange: bool = EXCHANGE_DEFAULT
    executor: Executor | None = field(default=None, compare=False, metadata=transient())

    def budget(self, n_layers: int) -> int:
        """``max_evaluations``, or the strategy's default budget for ``n_layers`` ranked layers."""
        if self.max_evaluations is not None:
            return self.max_evaluations
        return default_budget(n_layers, self.strategy, self.gallop_share)


@dataclass(frozen=True)
class FallbackConfig(_SearchSettings, Serializable):
    """How :func:`~quantdbg.fallback.end_to_end.auto_fallback` ranks and searches.

    Attributes:
        sensitivity: How the layers are ranked when no report is given (``mode="local"`` costs
            about two FP32 passes plus the output-space ranking's short passes;
            ``"isolated"``/``"leave-one-out"`` one pass per layer but rank by the task metric),
            and whether progress bars show.
        strategy: Search strategy (see :class:`SearchConfig`).
        precision: What the layers kept out of INT8 compute in: FP16 (TensorRT) or FP32 (CPU backends).
        max_evaluations: Search budget (None: the strategy's default budget).
        gallop_share: ``"auto"``: the largest ranked prefix tried, as a share of the layers.
        patience: ``"auto"``: leave the gallop after this many prefixes in a row without improvement.
        exchange: ``"auto"``: look for smaller sets with the budget left after group testing (off
            by default, see :class:`SearchConfig`).
        executor: Runs the independent evaluations of a search round as tasks (see
            :class:`SearchConfig`); the ranking's sweep runs on ``sensitivity.executor``.

    Raises:
        ConfigError: Unknown strategy, a budget below 1, a share outside (0, 1] or a patience below 1.
    """

    sensitivity: SensitivityConfig = field(default_factory=SensitivityConfig)
    strategy: Strategy = "auto"
    precision: Precision = Precision.FP16
    max_evaluations: int | None = None
    gallop_share: float = GALLOP_SHARE
    patience: int | None = None
    exchange: bool = EXCHANGE_DEFAULT
    executor: Executor | None = field(default=None, compare=False, metadata=transient())

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "precision", Precision(self.precision))

    @property
    def search(self) -> SearchConfig:
        """The search settings."""
        return SearchConfig(self.strategy, self.max_evaluations, self.gallop_share, self.patience,
                            self.exchange, self.executor)


__all__ = ["FallbackConfig", "SearchConfig"]
