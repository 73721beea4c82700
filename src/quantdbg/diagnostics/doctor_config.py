"""What the doctor runs and the thresholds its checks judge by."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, get_args

from quantdbg._json import Serializable
from quantdbg.config import CalibConfig, QuantConfig
from quantdbg.data import DEFAULT_BATCH_SIZE
from quantdbg.errors import ConfigError, unknown

CheckName = Literal["sensitive_layers", "weight_zeroing", "calibrator_disagreement", "calibration_size",
                    "mixed_ranges", "qdq_fusion", "folded_weights"]
"""The doctor's checks, in the order it runs them (a later check may use an earlier one's result)."""
CHECKS: tuple[CheckName, ...] = get_args(CheckName)

_AT_LEAST = {"batch_size": 1, "confirm_top": 1, "bootstrap_chunks": 2, "bootstrap_rounds": 2, "threads": 0}
_SHARES = ("zeroed_fraction", "dominant_share", "stable_spread", "swamped_fraction")  # in (0, 1]



@dataclass(frozen=True)
class DoctorConfig(Serializable):
    """What the doctor runs and the thresholds its checks judge by.

    Attributes:
        calib: How the model is calibrated before it is examined.
        quant: Where Q/DQ pairs go.
        checks: The checks to run, from :data:`CHECKS`.
        batch_size: Samples per batch for arrays and ``.npz`` data.
        confirm_top: Layers of the cheap (local) ranking confirmed in isolation.
        sensitive_sqnr_db: Isolated output SQNR (dB) below which a layer is sensitive.
        dominant_share: Share of the fully quantized model's output noise that makes one layer
            the culprit even when its SQNR looks fine.
        zeroed_fraction: Share of non-zero weights rounding to 0 above which a weight is named.
        disagreement_ratio: Largest / smallest calibrator clip above which calibrators disagree.
        disagreement_gain_db: SQNR gain (dB) of another calibrator over the one in use from which
            calibrators disagree materially, however close their clips.
        bootstrap_chunks: Interleaved chunks of calibration samples the bootstrap resamples.
        bootstrap_rounds: Resamples per sample-count level.
        stable_spread: Largest relative half-width of a scale's 10-90 % bootstrap band that still
            counts as stable.
        swamped_fraction: Share of a channel's non-zero values rounding to 0 that swamps it.
        hidden_sqnr_db: Whole-tensor SQNR at or above which swamped channels go unnoticed.
        threads: ONNX Runtime intra-op threads (0: all cores).
        seed: Seed of the bootstrap.

    Raises:
        ConfigError: A value is out of range or a check name is unknown.
    """

    calib: CalibConfig = field(default_factory=CalibConfig)
    quant: QuantConfig = field(default_factory=QuantConfig)
    checks: tuple[CheckName, ...] = CHECKS
    batch_size: int = DEFAULT_BATCH_SIZE
    confirm_top: int = 3
    sensitive_sqnr_db: float = 30.0
    dominant_share: float = 0.5
    zeroed_fraction: float = 0.05
    disagreement_ratio: float = 2.0
    disagreement_gain_db: float = 3.0
    bootstrap_chunks: int = 8
    bootstrap_rounds: int = 16
    stable_spread: float = 0.05
    swamped_fraction: float = 0.5
    hidden_sqnr_db: float = 25.0
    threads: int = 0
    seed: int = 0

    def __post_init__(self) -> None:
        if isinstance(self.checks, str):
            raise ConfigError("checks takes a sequence of check names, not one string.")
        object.__setattr__(self, "checks", tuple(self.checks))
        for name in self.checks:
            if name not in CHECKS:
                raise unknown("doctor check", name, CHECKS, ConfigError)
        values = self.__dict__
        wrong = [f"{name} must be >= {low}, got {values[name]}" for name, low in _AT_LEAST.items()
                 if values[name] < low]
        wrong += [f"{name} must be in (0, 1], got {values[name]}" for name in _SHARES
                  if not 0.0 < values[name] <= 1.0]
        if not self.disagreement_ratio > 1.0:
            wrong.append(f"disagreement_ratio must be > 1, got {self.disagreement_ratio}")
        if not self.disagreement_gain_db > 0.0:
            wrong.append(f"disagreement_gain_db must be > 0, got {self.disagreement_gain_db}")
        if wrong:
            raise ConfigError(f"DoctorConfig.{wrong[0]}.")

