"""The calibration pipeline: plan Q/DQ placement, collect statistics, compute ranges.

Exactly the activation tensors the Q/DQ plan will quantize are calibrated, in one streaming pass
over the data; histograms are collected only for tensors whose calibrator needs one.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from quantdbg import _display
from quantdbg.calibration.calibrators.base import (
    Calibrator,
    TensorRange,
    get_calibrator,
    spec_from_dict,
    spec_to_dict,
)
from quantdbg.calibration.stats import TensorStats, collect_stats, merge_stats, warn_nonfinite
from quantdbg.config import CalibConfig, QuantConfig, TensorKind
from quantdbg.data import DataSource
from quantdbg.errors import ConfigError
from quantdbg.model import ModelSource, as_loaded
from quantdbg.placement import QdqPlan, plan_qdq


@dataclass(frozen=True)
class CalibrationResult:
    """Activation ranges and the statistics behind them.

    Attributes:
        ranges: Activation tensor name -> chosen range.
        stats: Activation tensor name -> statistics (histograms when a histogram method ran).
        config: The configuration used.
        n_batches: Feeds consumed.
        n_samples: Samples consumed (sum of batch sizes on axis 0).
    """

    ranges: Mapping[str, TensorRange]
    stats: Mapping[str, TensorStats]
    config: CalibConfig = field(default_factory=CalibConfig)
    n_batches: int = 0
    n_samples: int = 0

    def scales(self) -> dict[str, float]:
        """Tensor name -> symmetric INT8 scale ``amax / 127`` (float32-rounded)."""
        return {name: r.scale for name, r in self.ranges.items()}

    def to_dict(self) -> dict[str, Any]:
        """Returns a JSON-serialisable dict (see :meth:`from_dict`)."""
        return {
            "ranges": {name: r.to_dict() for name, r in self.ranges.items()},
            "stats": {name: s.to_dict() for name, s in self.stats.items()},
            "config": calib_config_to_dict(self.config),
            "n_batches": self.n_batches,
            "n_samples": self.n_samples,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CalibrationResult:
        """Inverse of :meth:`to_dict`.

        Raises:
            ConfigError: The config names a calibrator that is not registered.
        """
        return cls(
            MappingProxyType({n: TensorRange.from_dict(r) for n, r in data["ranges"].items()}),
            MappingProxyType({n: TensorStats.from_dict(s) for n, s in data["stats"].items()}),
            calib_config_from_dict(data["config"]),
            int(data["n_batches"]),
            int(data["n_samples"]),
        )

    def _repr_html_(self) -> str:
        return _display.html(self)


def calib_config_to_dict(config: CalibConfig) -> dict[str, Any]:
    """JSON form of a :class:`CalibConfig` (per-op/per-tensor choices as ordered pairs)."""
    return {
        "method": spec_to_dict(config.method),
        "per_op": [[op, spec_to_dict(spec)] for op, spec in config.per_op.items()],
        "per_tensor": [[glob, spec_to_dict(spec)] for glob, spec in config.per_tensor.items()],
        "num_bins": config.num_bins,
        "max_batches": config.max_batches,
    }


def calib_config_from_dict(data: Mapping[str, Any]) -> CalibConfig:
    """Inverse of :func:`calib_config_to_dict`."""
    return CalibConfig(
        method=spec_from_dict(data["method"]),
        per_op={op: spec_from_dict(spec) for op, spec in data["per_op"]},
        per_tensor={glob: spec_from_dict(spec) for glob, spec in data["per_tensor"]},
        num_bins=int(data["num_bins"]),
        max_batches=None if data["max_batches"] is None else int(data["max_batches"]),
    )


_DEFAULT_CALIB = CalibConfig()
_DEFAULT_QUANT = QuantConfig()


def calibrate(model: ModelSource, data: DataSource, config: CalibConfig = _DEFAULT_CALIB,
              quant: QuantConfig = _DEFAULT_QUANT, *, plan: QdqPlan | None = None,
              progress: bool = False, session_options: Any = None) -> CalibrationResult:
    """Computes the range of every activation tensor the Q/DQ plan quantizes.

    Args:
        model: FP32 model: path, ModelProto (never modified) or LoadedModel (not re-checked).
        data: Calibration data (``.npz`` path, arrays, or feeds; see :func:`quantdbg.data.as_data`).
        config: Calibrator choice (default, per op type, per tensor glob), bins, batch limit.
        quant: Q/DQ placement, used to plan which tensors to calibrate when ``plan`` is None.
        plan: A ready plan (from :func:`quantdbg.placement.plan_qdq` on this model).
        progress: Show a progress bar (tqdm when installed, else log lines).
        session_options: ``onnxruntime.SessionOptions`` for the calibration session.

    Returns:
        Ranges, statistics, and batch/sample counts. Tensors that must share a scale (the plan's
        ``shared_scale_groups``) get one range computed from their merged statistics.

    Raises:
        ModelError: The model is invalid or already quantized.
        DataError: The data does not match the model's inputs (the message names the batch).
        ConfigError: A calibrator name is unknown, or the plan quantizes no activation.
        BackendError: ONNX Runtime failed.
    """
    loaded = as_loaded(model)
    if plan is None:
        plan = plan_qdq(loaded.proto, quant)
    tensors = plan.activation_tensors
    if not tensors:
        raise ConfigError("The Q/DQ plan quantizes no activation tensor, so there is nothing to calibrate. "
                          f"Check QuantConfig.op_types {quant.op_types} and exclude {quant.exclude}.")
    chosen = _choose_calibrators(config, plan)
    groups = [g for g in (tuple(t for t in group if t in chosen) for group in plan.shared_scale_groups)
              if len(g) > 1]
    for group in groups:  # a shared range needs every member's histogram if its calibrator does
        for name in group:
            chosen[name] = chosen[group[0]]
    need_hist = {name for name, cal in chosen.items() if cal.needs_histogram}
    collected = collect_stats(loaded, data, tensors, histogram=need_hist, num_bins=config.num_bins,
                              max_batches=config.max_batches, progress=progress,
                              session_options=session_options)
    warn_nonfinite(collected)
    ranges = _ranges(collected, chosen, groups)
    return CalibrationResult(MappingProxyType({name: ranges[name] for name in tensors}),
                             MappingProxyType(dict(collected)), config, collected.n_batches,
                             collected.n_samples)


def _ranges(stats: Mapping[str, TensorStats], chosen: Mapping[str, Calibrator],
            groups: list[tuple[str, ...]]) -> dict[str, TensorRange]:
    """Each tensor's range; a shared-scale group's from its members' merged statistics."""
    grouped = {name for group in groups for name in group}
    ranges = {name: cal.compute(stats[name]) for name, cal in chosen.items() if name not in grouped}
    for group in groups:
        merged = chosen[group[0]].compute(merge_stats("+".join(group), (stats[n] for n in group)))
        ranges.update({name: TensorRange(name, merged.lo, merged.hi, merged.method) for name in group})
    return ranges


def _choose_calibrators(config: CalibConfig, plan: QdqPlan) -> dict[str, Calibrator]:
    """Tensor -> calibrator; every spec in the config is resolved first, so typos fail early."""
    specs = [config.method, *config.per_op.values(), *config.per_tensor.values()]
    built: dict[Any, Calibrator] = {}
    for spec in specs:
        key = _spec_key(spec)
        if key not in built:
            built[key] = get_calibrator(spec)
    consumers: dict[str, list[str]] = {}
    for target in plan.targets:
        if target.kind is TensorKind.ACTIVATION:
            consumers.setdefault(target.tensor, []).append(target.op_type)
    return {name: built[_spec_key(config.method_for(name, tuple(dict.fromkeys(ops))))]
            for name, ops in ((t, consumers.get(t, [])) for t in plan.activation_tensors)}


def _spec_key(spec: Any) -> Any:
    try:
        hash(spec)
    except TypeError:
        return id(spec)
    return spec
