"""What the mixed-precision model must achieve: a task-metric bound, a relative loss, or an SQNR."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, get_args

from quantdbg._json import Serializable
from quantdbg.errors import ConfigError, check_choice

TargetKind = Literal["metric", "relative_loss", "sqnr"]
"""How a target reads the value ``evaluate`` returns (see :class:`FallbackTarget`)."""

TARGET_KINDS: tuple[TargetKind, ...] = get_args(TargetKind)


@dataclass(frozen=True)
class FallbackTarget(Serializable):
    """What the mixed-precision model must achieve.

    Attributes:
        kind: ``"metric"``: task metric at least ``threshold`` (at most, when lower is better);
            ``"relative_loss"``: loss against the FP32 ``reference`` at most ``threshold`` percent;
            ``"sqnr"``: output SQNR at least ``threshold`` dB.
        threshold: The bound.
        lower_is_better: Direction of the task metric (``"metric"``/``"relative_loss"`` only).
        reference: The FP32 model's task metric (required by ``"relative_loss"``).

    Raises:
        ConfigError: Unknown kind, non-finite threshold, a negative loss bound, or
            ``lower_is_better`` with an SQNR target.
    """

    kind: TargetKind
    threshold: float
    lower_is_better: bool = False
    reference: float | None = None

    def __post_init__(self) -> None:
        check_choice("target kind", self.kind, TARGET_KINDS)
        if not math.isfinite(self.threshold):
            raise ConfigError(f"The target threshold must be finite, got {self.threshold}.")
        if self.kind == "relative_loss" and self.threshold < 0:
            raise ConfigError(f"A relative-loss bound is a percentage >= 0, got {self.threshold}.")
        if self.kind == "sqnr" and self.lower_is_better:
            raise ConfigError("An SQNR target is always higher-is-better; drop lower_is_better.")
        if self.reference is not None and not math.isfinite(self.reference):
            raise ConfigError(f"The reference metric must be finite, got {self.reference}.")

    @classmethod
    def min_metric(cls, value: float, lower_is_better: bool = False) -> FallbackTarget:
        """Task metric >= ``value`` (<= when ``lower_is_better``)."""
        return cls("metric", float(value), lower_is_better)

    @classmethod
    def max_relative_loss(cls, percent: float, reference: float | None = None,
                          lower_is_better: bool = False) -> FallbackTarget:
        """Task metric within ``percent`` % of the FP32 ``reference``."""
        return cls("relative_loss", float(percent), lower_is_better, reference)

    @classmethod
    def min_sqnr(cls, db: float) -> FallbackTarget:
        """Output SQNR >= ``db`` dB."""
        return cls("sqnr", float(db))

    @property
    def higher_is_better(self) -> bool:
        """Direction of the value ``evaluate`` returns."""
        return not self.lower_is_better

    def with_reference(self, reference: float) -> FallbackTarget:
        """The same target with the FP32 reference metric filled in."""
        return FallbackTarget(self.kind, self.threshold, self.lower_is_better, float(reference))

    def relative_loss(self, value: float) -> float:
        """Loss of ``value`` against the reference, in percent (negative when better).

        Raises:
            ConfigError: No reference is set.
        """
        if self.reference is None:
            raise ConfigError("A relative-loss target needs the FP32 reference metric; build it with "
                              "FallbackTarget.max_relative_loss(pct, reference=...).")
        drop = value - self.reference if self.lower_is_better else self.reference - value
        return 100.0 * drop / max(abs(self.reference), 1e-12)

    def is_met(self, value: float) -> bool:
        """True when ``value`` (what ``evaluate`` returned) satisfies the target."""
        if math.isnan(value):
            return False
        if self.kind == "relative_loss":
            return self.relative_loss(value) <= self.threshold
        return value <= self.threshold if self.lower_is_better else value >= self.threshold

    def better(self, a: float, b: float) -> bool:
        """True when value ``a`` is strictly better than ``b``."""
        if math.isnan(b):
            return not math.isnan(a)
        return a < b if self.lower_is_better else a > b

    def describe(self) -> str:
        """E.g. ``metric >= 0.99`` or ``relative loss <= 1 % of 0.339``."""
        if self.kind == "relative_loss":
            ref = "?" if self.reference is None else f"{self.reference:.6g}"
            return f"relative loss <= {self.threshold:g} % of {ref}"
        if self.kind == "sqnr":
            return f"output SQNR >= {self.threshold:g} dB"
        return f"metric {'<=' if self.lower_is_better else '>='} {self.threshold:g}"


__all__ = ["TARGET_KINDS", "FallbackTarget", "TargetKind"]
