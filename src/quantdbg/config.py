"""Frozen configuration dataclasses, validated on construction, read and written as JSON.

Calibrator choice is typed: a registered calibrator name (``"entropy"``) or an instance of that
calibrator's own config dataclass (``PercentileConfig(99.9)``), never an untyped option dict.
In JSON a choice is ``{"calibrator": name, "config": {...} | null}``; the table of names and
config classes (:mod:`quantdbg._calibrator_specs`) sits below this module, so a config reads and
writes the same whatever was imported before.
"""
from __future__ import annotations

import fnmatch
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from types import MappingProxyType
from typing import Any

from quantdbg import _json
from quantdbg._calibrator_specs import spec_config, spec_name
from quantdbg.errors import ConfigError, FormatError
from quantdbg.execution import Executor

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
class CalibratorChoice(_json.Serializable):
    """A calibrator spec as JSON holds it.

    Attributes:
        calibrator: The registered calibrator name.
        config: The fields of its config instance, or None for a spec given by name (the
            calibrator's default configuration).
    """

    calibrator: str
    config: Mapping[str, Any] | None = None


def _choice(spec: CalibratorSpec) -> CalibratorChoice:
    """The JSON form of ``spec`` (ConfigError when it names no registered calibrator)."""
    name = spec_name(spec)
    return CalibratorChoice(name, None if isinstance(spec, str) else _json.encode(spec))


def _spec(choice: CalibratorChoice, where: str) -> CalibratorSpec:
    """The spec ``choice`` describes: the name, or an instance of its config class.

    Raises:
        FormatError: The calibrator is not registered or its config fields do not match its
            config class (the message names ``where``).
    """
    try:
        config = spec_config(choice.calibrator)
    except ConfigError as err:
        raise FormatError(f"field {where!r}: {err}") from None
    if choice.config is None:
        return choice.calibrator
    return _json.decode(config, dict(choice.config), f"{where}.config")


def check_shards(shards: int | None) -> None:
    """Checks a shard count (None: the executor's worker count).

    Raises:
        ConfigError: Not an integer >= 1.
    """
    if shards is not None and (isinstance(shards, bool) or not isinstance(shards, int) or shards < 1):
        raise ConfigError(f"shards must be an integer >= 1 or None (one per worker), got {shards!r}.")


@dataclass(frozen=True)
class _CalibConfigForm:
    """How :class:`CalibConfig` is written: per-op and per-tensor choices as ordered pairs."""

    method: CalibratorChoice
    per_op: tuple[tuple[str, CalibratorChoice], ...]
    per_tensor: tuple[tuple[str, CalibratorChoice], ...]
    num_bins: int
    max_batches: int | None
    # written only when set, so the form of files written before is unchanged
    bias_correction: bool | None = field(default=None, metadata=_json.optional())
    equalize: bool | None = field(default=None, metadata=_json.optional())


@dataclass(frozen=True)
class CalibConfig(_json.Serializable):
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
        bias_correction: Also measure, in one more pass, the mean shift INT8 weight rounding adds to
            each output channel of every quantized Conv/ConvTranspose/Gemm/MatMul, and subtract it
            from the layer's bias when the Q/DQ model is built
            (:mod:`quantdbg.calibration.bias_correction`).
        equalize: Calibrate (and quantize) the model after cross-layer equalization, which rescales
            the channels of consecutive Conv/Gemm layers so their ranges balance, keeping the FP32
            function (:mod:`quantdbg.calibration.equalization`).
        executor: Where the statistics are collected (None: in this process): with an executor the
            data is split into ``shards`` sample ranges collected as tasks and merged exactly, so the
            ranges are the same bits. Not part of the JSON form or of equality (it changes no result).
        shards: Sample ranges the data is split into with an executor (None: its ``workers()``).
    """

    method: CalibratorSpec = "entropy"
    per_op: Mapping[str, CalibratorSpec] = field(default_factory=dict)
    per_tensor: Mapping[str, CalibratorSpec] = field(default_factory=dict)
    num_bins: int = 2048
    max_batches: int | None = None
    bias_correction: bool = False
    equalize: bool = False
    executor: Executor | None = field(default=None, compare=False, metadata=_json.transient())
    shards: int | None = field(default=None, compare=False, metadata=_json.transient())

    def __post_init__(self) -> None:
        object.__setattr__(self, "per_op", _frozen_map(self.per_op))
        object.__setattr__(self, "per_tensor", _frozen_map(self.per_tensor))
        if self.num_bins < 128 or self.num_bins & (self.num_bins - 1):
            raise ConfigError(f"num_bins must be a power of two >= 128, got {self.num_bins}.")
        if self.max_batches is not None and self.max_batches < 1:
            raise ConfigError(f"max_batches must be >= 1 or None, got {self.max_batches}.")
        check_shards(self.shards)

    def method_for(self, tensor: str, consumer_ops: tuple[str, ...] = ()) -> CalibratorSpec:
        """Returns the calibrator for ``tensor``: per-tensor glob, then per-op, then default."""
        for pattern, spec in self.per_tensor.items():
            if fnmatch.fnmatchcase(tensor, pattern):
                return spec
        for op in consumer_ops:
            if op in self.per_op:
                return self.per_op[op]
        return self.method

    def __json_encode__(self) -> Any:
        """JSON form: each calibrator spec as a :class:`CalibratorChoice`, per-op/per-tensor as pairs."""
        return _json.encode(_CalibConfigForm(
            _choice(self.method), tuple((op, _choice(s)) for op, s in self.per_op.items()),
            tuple((glob, _choice(s)) for glob, s in self.per_tensor.items()), self.num_bins,
            self.max_batches, self.bias_correction or None, self.equalize or None))

    @classmethod
    def __json_decode__(cls, data: Any, where: str) -> CalibConfig:
        """Inverse of :meth:`__json_encode__` (FormatError naming the field for bad data)."""
        form = _json.decode(_CalibConfigForm, data, where)
        at = f"{where}." if where else ""
        per_op = {op: _spec(c, f"{at}per_op[{i}][1]") for i, (op, c) in enumerate(form.per_op)}
        per_tensor = {glob: _spec(c, f"{at}per_tensor[{i}][1]")
                      for i, (glob, c) in enumerate(form.per_tensor)}
        return _json.construct(cls, {"method": _spec(form.method, f"{at}method"), "per_op": per_op,
                                     "per_tensor": per_tensor, "num_bins": form.num_bins,
                                     "max_batches": form.max_batches,
                                     "bias_correction": bool(form.bias_correction),
                                     "equalize": bool(form.equalize)}, where)


@dataclass(frozen=True)
class QuantConfig(_json.Serializable):
    """Where Q/DQ pairs go (TensorRT explicit-quantization placement).

    Attributes:
        op_types: Op types whose inputs are quantized (both data and weight inputs).
        exclude: Node names or globs kept out of INT8 (planned without Q/DQ pairs).
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
