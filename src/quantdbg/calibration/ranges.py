"""The calibration pipeline: plan Q/DQ placement, collect statistics, compute ranges.

Exactly the activation tensors the Q/DQ plan will quantize are calibrated, in one streaming pass
over the data; histograms are collected only for tensors whose calibrator needs one.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

from quantdbg import _display, _json
from quantdbg.calibration.bias_correction import BiasCorrections, correct_biases
from quantdbg.calibration.calibrators.base import Calibrator, TensorRange, get_calibrator
from quantdbg.calibration.collect import CollectConfig, collect_stats, warn_nonfinite
from quantdbg.calibration.equalization import Equalization, equalize
from quantdbg.calibration.sample_peaks import check_beyond_fp16, warn_one_sample_ranges
from quantdbg.calibration.stats import TensorStats, merge_stats
from quantdbg.config import CalibConfig, QuantConfig, TensorKind
from quantdbg.data import DataSource
from quantdbg.errors import ConfigError, NotCalibratedError
from quantdbg.model.footprint import Footprint, footprint
from quantdbg.model.load import ModelSource, as_loaded
from quantdbg.model.names import check_node_globs
from quantdbg.model.weights import FoldedWeight
from quantdbg.placement import QdqPlan, plan_qdq


def _untagged(data: dict[str, Any]) -> dict[str, Any] | None:
    """A calibration result written before results had a tag: recognised by its keys."""
    return data if {"ranges", "stats", "config"} <= data.keys() else None


@_json.document("quantdbg.calibration", 1, untagged=_untagged)
@dataclass(frozen=True, repr=False)
class CalibrationResult(_display.Displayable, _json.Serializable):
    """Activation ranges and the statistics behind them.

    Attributes:
        ranges: Activation tensor name -> chosen range.
        stats: Activation tensor name -> statistics (histograms when a histogram method ran).
        config: The configuration used.
        n_batches: Feeds consumed.
        n_samples: Samples consumed (sum of batch sizes on axis 0).
        folded_weights: Weights the model held outside plain initializers, folded before
            placement (the plan's :attr:`~quantdbg.placement.QdqPlan.folded_weights`).
        footprint: The model's weight bytes and the process's peak RSS when the result was made
            (None in files written before it was recorded).
        bias_correction: The bias corrections measured (``config.bias_correction``; None: not asked).
        equalization: The pairs cross-layer equalization rescaled before calibrating
            (``config.equalize``; None: not asked).
    """

    ranges: Mapping[str, TensorRange]
    stats: Mapping[str, TensorStats]
    config: CalibConfig = field(default_factory=CalibConfig)
    n_batches: int = 0
    n_samples: int = 0
    folded_weights: tuple[FoldedWeight, ...] = ()
    footprint: Footprint | None = field(default=None, compare=False, metadata=_json.optional())
    bias_correction: BiasCorrections | None = field(default=None, metadata=_json.optional())
    equalization: Equalization | None = field(default=None, metadata=_json.optional())

    def __post_init__(self) -> None:
        object.__setattr__(self, "ranges", MappingProxyType(dict(self.ranges)))
        object.__setattr__(self, "stats", MappingProxyType(dict(self.stats)))

    def scales(self) -> dict[str, float]:
        """Tensor name -> symmetric INT8 scale ``amax / 127`` (float32-rounded)."""
        return {name: r.scale for name, r in self.ranges.items()}


_DEFAULT_CALIB = CalibConfig()
_DEFAULT_QUANT = QuantConfig()


def calibrate(model: ModelSource, data: DataSource, config: CalibConfig = _DEFAULT_CALIB,
              placement: QuantConfig | QdqPlan = _DEFAULT_QUANT, *, progress: bool = False,
              session_options: Any = None) -> CalibrationResult:
    """Computes the range of every activation tensor the Q/DQ plan quantizes.

    Args:
        model: FP32 model: path, ModelProto (never modified) or LoadedModel (not re-checked).
        data: Calibration data (``.npz`` path, arrays, or feeds; see :func:`quantdbg.data.as_data`).
        config: Calibrator choice (default, per op type, per tensor glob), bins, batch limit, the
            executor collecting the statistics in shards (same ranges, bit for bit), cross-layer
            equalization first, and bias correction (one more pass over the data).
        placement: Where Q/DQ pairs go: a QuantConfig to plan from, or a ready plan (from
            :func:`quantdbg.placement.plan_qdq` on this model, e.g. the one ``insert_qdq`` will use).
        progress: Show a progress bar (tqdm when installed, else log lines).
        session_options: ``onnxruntime.SessionOptions`` for the calibration session.

    Returns:
        Ranges, statistics, and batch/sample counts. Tensors that must share a scale (the plan's
        ``shared_scale_groups``) get one range computed from their merged statistics.

    Raises:
        ModelError: The model is invalid or already quantized, a ``per_tensor`` glob matches no
            tensor (the message names the closest), or a corrupt initializer drives a tensor beyond
            float16's range.
        DataError: The data does not match the model's inputs (the message names the batch), holds
            NaN/Inf, or drives a few values of a tensor beyond float16's range, so far that they
            would round its other values to 0 (the message names the sample).
        ConfigError: A calibrator name is unknown, or the plan quantizes no activation.
        BackendError: ONNX Runtime failed.

    Warns:
        QuantDbgWarning: A tensor beyond float16's range, or a range one sample alone sets so wide
            that the other samples quantize to 0.
    """
    loaded = as_loaded(model)
    equalized = equalize(loaded) if config.equalize else None  # before any statistics: it changes them
    loaded = loaded if equalized is None else equalized.model
    plan = placement if isinstance(placement, QdqPlan) else plan_qdq(loaded, placement)
    tensors = plan.activation_tensors
    if not tensors:
        check = (f"QuantConfig.op_types {placement.op_types} and exclude {placement.exclude}"
                 if isinstance(placement, QuantConfig) else "the QuantConfig the plan was made with")
        raise ConfigError(f"The Q/DQ plan quantizes no activation tensor, so there is nothing to calibrate. "
                          f"Check {check}.")
    graph = loaded.proto.graph
    # A per-tensor glob that matches no tensor is a typo, not a choice to ignore silently.
    check_node_globs("CalibConfig.per_tensor", config.per_tensor,
                     [*(i.name for i in graph.input), *(o for n in graph.node for o in n.output if o)],
                     kind="tensor")
    chosen, groups = _choices(config, plan)
    need_hist = frozenset(name for name, cal in chosen.items() if cal.needs_histogram)
    collect = CollectConfig(need_hist, config.num_bins, config.max_batches, config.executor, config.shards)
    collected = collect_stats(loaded, data, tensors, collect, progress=progress,
                              session_options=session_options)
    check_beyond_fp16(collected, loaded.proto)  # first: a refused value's Inf downstream is no news
    warn_nonfinite(collected)
    ranges = _ranges(collected, chosen, groups)
    warn_one_sample_ranges(collected, ranges)
    bias = correct_biases(loaded, data, plan, max_batches=config.max_batches, progress=progress) \
        if config.bias_correction else None
    return CalibrationResult({name: ranges[name] for name in tensors}, dict(collected), config,
                             collected.n_batches, collected.n_samples, plan.folded_weights,
                             footprint(loaded.proto), bias,
                             None if equalized is None else equalized.equalization)


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


def recalibrate(calibration: CalibrationResult, config: CalibConfig, plan: QdqPlan) -> CalibrationResult:
    """The ranges ``config`` chooses from the statistics a calibration already holds (no pass over data).

    Statistics do not depend on the calibrator, so another choice (e.g. per-tensor calibrators)
    needs no new pass when every tensor's statistics are there, with a histogram for each tensor
    whose new calibrator reads one.

    Args:
        calibration: An earlier calibration of the same model and plan.
        config: The calibrator choice to apply.
        plan: The Q/DQ plan ``calibration`` was made for.

    Returns:
        The same statistics and counts with the ranges ``config`` chooses; the result equals what
        :func:`calibrate` with ``config`` gives on the same data.

    Raises:
        ConfigError: A calibrator name is unknown.
        NotCalibratedError: A tensor has no statistics, or no histogram while its calibrator needs one;
            ``config`` equalizes where the calibration did not (or the reverse), or asks for bias
            corrections it does not hold.
    """
    _check_same_model(calibration, config)
    chosen, groups = _choices(config, plan)
    for name, calibrator in chosen.items():
        stats = calibration.stats.get(name)
        if stats is None or (calibrator.needs_histogram and stats.hist is None):
            missing = "statistics" if stats is None else "histogram"
            raise NotCalibratedError(f"Tensor {name!r} has no {missing} in the calibration, which its "
                                     f"calibrator {calibrator.name!r} needs; calibrate again with "
                                     "calibrate().")
    ranges = _ranges(calibration.stats, chosen, groups)
    chosen_ranges = {name: ranges[name] for name in plan.activation_tensors}
    corrections = calibration.bias_correction if config.bias_correction else None
    return replace(calibration, ranges=chosen_ranges, config=config, bias_correction=corrections)


def _check_same_model(calibration: CalibrationResult, config: CalibConfig) -> None:
    """Statistics of an equalized model do not serve the original (and the reverse); corrections that
    were not measured cannot be chosen."""
    if config.equalize != calibration.config.equalize:
        measured = "the equalized model" if calibration.config.equalize else "the model as given"
        raise NotCalibratedError(f"The calibration's statistics are of {measured}, but the config says "
                                 f"equalize={config.equalize}; calibrate again with calibrate().")
    if config.bias_correction and calibration.bias_correction is None:
        raise NotCalibratedError("The calibration holds no bias corrections, which the config asks for; "
                                 "calibrate again with calibrate().")


def _choices(config: CalibConfig, plan: QdqPlan) -> tuple[dict[str, Calibrator], list[tuple[str, ...]]]:
    """Tensor -> calibrator, and the shared-scale groups (each member takes its first member's calibrator)."""
    chosen = _choose_calibrators(config, plan)
    groups = [g for g in (tuple(t for t in group if t in chosen) for group in plan.shared_scale_groups)
              if len(g) > 1]
    for group in groups:  # a shared range needs every member's histogram if its calibrator does
        for name in group:
            chosen[name] = chosen[group[0]]
    return chosen, groups
