"""Frozen configuration dataclasses, validated on construction.

Calibrator choice is typed: a registered calibrator name (``"entropy"``) or an instance of that
calibrator's own config dataclass (``PercentileConfig(99.9)``), never an untyped option dict.
"""
from __future__ import annotations

import fnmatch
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from types import MappingProxyType
from typing import Any

from quantdbg.errors import ConfigError

CalibratorSpec = str | Any
"""A registered calibrator name, or an instance of a registered calibrator's config class."""

DEFAULT_OP_TYPES = ("Conv", "ConvTranspose", "Gemm", "MatMul")


class TensorKind(str, Enum):
    """What a quantized input is: a weight (constant, quantized per output channel from its own
    values) or an activation (computed, quantized per tensor from calibration)."""

    WEIGHT = "weight"
    ACTIVATION = "activation"


class Precision(str, Enum):
    """Precision a layer left out of INT8 computes in."""

    FP16 = "fp16"
    FP32 = "fp32"


def _frozen_map(value: Mapping[str, Any] | None) -> Mapping[str, Any]:
    return MappingProxyType(dict(value or {}))


@dataclass(frozen=True)
class CalibConfig:
    """How activation ranges are computed.

    Attributes:
        method: Default calibrator for every activation tensor.
        per_op: Op type -> calibrator, for activation tensors consumed by a node of that op type
            (e.g. ``{"Conv": "entropy"}``).
        per_tensor: Tensor-name glob -> calibrator (e.g. ``{"*/head/*": "percentile"}``); wins over
            ``per_op``; the first matching glob in insertion order applies.
        num_bins: Histogram resolution the calibrators work at (|x| is collected at 16x this
            resolution and regrouped, so the bins stay useful whatever the range).
        max_batches: Stop after this many feeds (None: all).
    """

    method: CalibratorSpec = "entropy"
    per_op: Mapping[str, CalibratorSpec] = field(default_factory=dict)
    per_tensor: Mapping[str, CalibratorSpec] = field(default_factory=dict)
    num_bins: int = 2048
    max_batches: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "per_op", _frozen_map(self.per_op))
        object.__setattr__(self, "per_tensor", _frozen_map(self.per_tensor))
        if self.num_bins < 128 or self.num_bins & (self.num_bins - 1):
            raise ConfigError(f"num_bins must be a power of two >= 128, got {self.num_bins}.")
        if self.max_batches is not None and self.max_batches < 1:
            raise ConfigError(f"max_batches must be >= 1 or None, got {self.max_batches}.")

    def method_for(self, tensor: str, consumer_ops: tuple[str, ...] = ()) -> CalibratorSpec:
        """Returns the calibrator for ``tensor``: per-tensor glob, then per-op, then default."""
        for pattern, spec in self.per_tensor.items():
            if fnmatch.fnmatchcase(tensor, pattern):
                return spec
        for op in consumer_ops:
            if op in self.per_op:
                return self.per_op[op]
        return self.method


@dataclass(frozen=True)
class QuantConfig:
    """Where Q/DQ pairs go (TensorRT explicit-quantization placement).

    Attributes:
        op_types: Op types whose inputs are quantized (both data and weight inputs).
        exclude: Node names or globs left unquantized.
        quantize_residual_add: Quantize the other input of an Add fed by a quantized Conv, so
            TensorRT fuses Conv+Add.
        per_channel: Per-output-channel weight scales (per-tensor otherwise).
        share_concat_scales: Give the quantized inputs of a Concat one shared scale.
    """

    op_types: tuple[str, ...] = DEFAULT_OP_TYPES
    exclude: tuple[str, ...] = ()
    quantize_residual_add: bool = True
    per_channel: bool = True
    share_concat_scales: bool = True

    def __post_init__(self) -> None:
        if isinstance(self.exclude, str) or isinstance(self.op_types, str):
            raise ConfigError("op_types and exclude take a sequence of strings, not one string.")
        object.__setattr__(self, "op_types", tuple(self.op_types))
        object.__setattr__(self, "exclude", tuple(self.exclude))
        if not self.op_types:
            raise ConfigError("op_types is empty: nothing would be quantized.")

    def is_excluded(self, node_name: str) -> bool:
        """True when ``node_name`` matches an exclusion name or glob."""
        return any(fnmatch.fnmatchcase(node_name, pattern) for pattern in self.exclude)
