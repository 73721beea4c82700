"""Why a layer is sensitive: weight and activation evidence for the sensitivity ranking.

* weights: relative quantization error with a per-tensor scale vs per-channel scales, and the
  share of non-zero weights that round to zero (the classic sign of one outlier channel
  stretching a per-tensor range);
* activations: outlier ratio max|x| / 99.99th percentile of |x| (from the calibration
  histograms), and which registered calibrator's range gives the layer the smallest local
  error -- measured with one pass of a local graph holding a clone per candidate range.
"""
from __future__ import annotations

import logging
import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx

from quantdbg._json import Serializable
from quantdbg.calibration import CollectConfig, PercentileConfig, TensorStats, collect_stats
from quantdbg.calibration.calibrators.base import calibrator_amaxes, get_calibrator
from quantdbg.config import TensorKind
from quantdbg.errors import QuantDbgError, QuantDbgWarning
from quantdbg.model.graph import trans_b
from quantdbg.qdq import QdqRecord, QuantizedModel
from quantdbg.quant_math import channel_axis, channel_scale, fake_quant, zeroed_fraction
from quantdbg.sensitivity.config import SensitivityConfig
from quantdbg.sensitivity.evaluator import VariantEvaluator
from quantdbg.sensitivity.graphs import LocalVariant, fp32_weight
from quantdbg.sensitivity.reductions import DataPass, run_local_graph

logger = logging.getLogger(__name__)

OUTLIER_PERCENTILE = 99.99


@dataclass(frozen=True)
class LayerEvidence(Serializable):
    """Evidence for why a layer loses accuracy in INT8.

    Attributes:
        weight_error_per_tensor: ||Q(w) - w|| / ||w|| with one scale for the whole weight.
        weight_error_per_channel: The same with one scale per output channel.
        weight_zero_fraction: Share of non-zero weights that quantize to 0 with the scales in the
            model.
        weight_zero_fraction_per_tensor: The same with a per-tensor scale.
        activation_outlier_ratio: max|x| / 99.99th percentile of |x| over the layer's activation
            inputs (the largest ratio when several); large values mean a few outliers set the
            range.
        calibrator_sqnr: Calibrator -> the layer's local output SQNR (dB) with that calibrator's
            activation range (weights as in the model).
        recorded_sqnr: The layer's local output SQNR (dB) with the ranges in the model.
        best_calibrator: The calibrator with the highest local SQNR.
    """

    weight_error_per_tensor: float | None = None
    weight_error_per_channel: float | None = None
    weight_zero_fraction: float | None = None
    weight_zero_fraction_per_tensor: float | None = None
    activation_outlier_ratio: float | None = None
    calibrator_sqnr: Mapping[str, float] | None = None
    recorded_sqnr: float | None = None
    best_calibrator: str | None = None


def _output_axis(record: QdqRecord, w: np.ndarray, node: onnx.NodeProto | None) -> int:
    return channel_axis(record.op_type, w.ndim, trans_b(node), record.axis)


def weight_evidence(record: QdqRecord, weights: np.ndarray, node: onnx.NodeProto | None) -> dict[str, float]:
    """Per-tensor vs per-channel error and zeroed-weight shares of one weight (float64 NumPy).

    Args:
        record: The weight's Q/DQ record (its scales are the ones in the model).
        weights: The FP32 weight values.
        node: The consumer node in the FP32 model (for Gemm's ``transB``).

    Returns:
        The four ``weight_*`` fields of :class:`LayerEvidence`.
    """
    w = np.asarray(weights, np.float64)
    norm = float(np.linalg.norm(w)) or 1.0
    per_tensor = channel_scale(w, None)
    if w.ndim >= 2 or (w.ndim == 1 and record.axis is not None):
        per_channel = channel_scale(w, _output_axis(record, w, node))
    else:
        per_channel = per_tensor
    recorded = np.asarray(record.scale, np.float64)
    if record.axis is not None and recorded.size > 1:
        shape = [1] * w.ndim
        shape[record.axis % w.ndim] = recorded.size
        recorded = recorded.reshape(shape)
    else:
        recorded = recorded.reshape(())
    return {
        "weight_error_per_tensor": float(np.linalg.norm(fake_quant(w, per_tensor) - w)) / norm,
        "weight_error_per_channel": float(np.linalg.norm(fake_quant(w, per_channel) - w)) / norm,
        "weight_zero_fraction": zeroed_fraction(w, recorded),
        "weight_zero_fraction_per_tensor": zeroed_fraction(w, per_tensor),
    }


def outlier_ratio(stats: TensorStats) -> float | None:
    """max|x| / the 99.99th percentile of |x| (from the histogram); None without a histogram."""
    if stats.hist is None or stats.absmax == 0.0:
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", QuantDbgWarning)
        clip = get_calibrator(PercentileConfig(OUTLIER_PERCENTILE)).compute(stats).amax
    return stats.absmax / clip if clip > 0 else None


def calibrator_variants(qmodel: QuantizedModel, layers: Sequence[str],
                        stats: Mapping[str, TensorStats]) -> list[LocalVariant]:
    """The local-graph clones that test every candidate calibrator on every layer."""
    ranges = {name: calibrator_amaxes(s) for name, s in stats.items()}
    variants = []
    for layer in layers:
        acts = [r for r in qmodel.records_of(layer) if r.kind is TensorKind.ACTIVATION and r.tensor in ranges]
        variants.append(LocalVariant(layer, "recorded", {}))
        if not acts:
            continue
        methods = set.intersection(*(set(ranges[r.tensor]) for r in acts))
        for method in sorted(methods):
            amax = {r.input_index: ranges[r.tensor][method] for r in acts}
            variants.append(LocalVariant(layer, method, amax))
    return variants


def layer_evidence(fp_model: onnx.ModelProto, qmodel: QuantizedModel, layer: str,
                   stats: Mapping[str, TensorStats], local_sqnr: Mapping[str, float],
                   weights: bool = True) -> LayerEvidence:
    """Assembles a layer's evidence.

    Args:
        fp_model: The FP32 model (weights).
        qmodel: The Q/DQ model's records.
        layer: The node name.
        stats: Activation statistics with histograms (may lack some tensors).
        local_sqnr: Variant label (``"recorded"`` or a calibrator) -> this layer's local SQNR.
        weights: Add the weight evidence (False: its fields stay None).

    Returns:
        The evidence; fields without data are None.
    """
    nodes = {n.name: n for n in fp_model.graph.node}
    fields: dict[str, Any] = {}
    worst_error = -1.0
    for record in qmodel.records_of(layer):
        if record.kind is TensorKind.WEIGHT:
            if not weights:
                continue
            values = fp32_weight(fp_model, record)
            if values is not None and values.size:
                found = weight_evidence(record, values, nodes.get(layer))
                if found["weight_error_per_channel"] > worst_error:  # several weights: the worst one
                    worst_error = found["weight_error_per_channel"]
                    fields.update(found)
        elif record.tensor in stats:
            ratio = outlier_ratio(stats[record.tensor])
            if ratio is not None:
                fields["activation_outlier_ratio"] = max(ratio, fields.get("activation_outlier_ratio", 0.0))
    calibrators = {k: v for k, v in local_sqnr.items() if k != "recorded"}
    if calibrators:
        fields["calibrator_sqnr"] = calibrators
        fields["best_calibrator"] = max(sorted(calibrators), key=lambda k: _rankable(calibrators[k]))
    fields["recorded_sqnr"] = local_sqnr.get("recorded")
    return LayerEvidence(**fields)


def _rankable(value: float) -> float:
    return -math.inf if math.isnan(value) else value


def _activation_stats(evaluator: VariantEvaluator, config: SensitivityConfig) -> dict[str, TensorStats]:
    """Activation statistics with histograms: from the calibration when it kept them, else collected."""
    records = evaluator.qmodel.records
    tensors = list(dict.fromkeys(r.tensor for r in records if r.kind is TensorKind.ACTIVATION))
    calibration = evaluator.qmodel.calibration
    stats = dict(calibration.stats) if calibration is not None else {}
    missing = [t for t in tensors if t not in stats or stats[t].hist is None]
    if missing:
        evaluator.n_passes += 1
        stats.update(collect_stats(evaluator.fp_model, evaluator.data, missing,
                                   CollectConfig(histogram=True, max_batches=config.evidence_batches)))
    return {t: stats[t] for t in tensors if t in stats}


def collect_evidence(evaluator: VariantEvaluator, config: SensitivityConfig,
                     calibrators_only: bool = False) -> dict[str, LayerEvidence]:
    """Every layer's evidence: its weights, its activations' outliers, and each calibrator's local SQNR.

    The calibrator comparison is one pass of a local graph over ``config.evidence_batches``
    batches, with a clone per layer and distinct candidate range (calibrators that choose the same
    range for a layer's inputs share one clone and so one SQNR).

    Args:
        evaluator: The models and data (its pass count is increased).
        config: The analysis settings (``evidence_batches``, ``progress``).
        calibrators_only: Only what :func:`~quantdbg.sensitivity.suggest_calibrators` reads: each
            calibrator's local SQNR and the activations' outlier ratios (no weight evidence, no
            clone with the recorded ranges: ``recorded_sqnr`` stays None).

    Returns:
        Layer -> evidence, for every quantized layer.
    """
    try:
        stats = _activation_stats(evaluator, config)
    except QuantDbgError as err:  # e.g. a tensor ORT cannot expose: evidence is optional
        logger.warning("activation evidence skipped: %s", err)
        stats = {}
    variants = calibrator_variants(evaluator.qmodel, evaluator.layers, stats)
    if calibrators_only:
        variants = [v for v in variants if v.activation_amax]
    distinct, clone_of = _distinct(variants)
    run = DataPass("sensitivity (evidence)", config.progress, config.evidence_batches)
    found = run_local_graph(evaluator, distinct, run)
    local: dict[str, dict[str, float]] = {layer: {} for layer in evaluator.layers}
    for index, variant in enumerate(variants):
        if clone_of[index] in found:
            local[variant.layer][variant.label] = found[clone_of[index]].sqnr_db
    return {layer: layer_evidence(evaluator.fp_model, evaluator.qmodel, layer, stats, local[layer],
                                  weights=not calibrators_only) for layer in evaluator.layers}


def _distinct(variants: Sequence[LocalVariant]) -> tuple[list[LocalVariant], list[int]]:
    """The variants whose clones differ (a layer and its ranges), and each variant's index among them:
    on clipped activations (ReLU6) most calibrators choose the same range."""
    seen: dict[tuple[str, tuple[tuple[int, float], ...]], int] = {}
    distinct: list[LocalVariant] = []
    clone_of = []
    for variant in variants:
        key = (variant.layer, tuple(sorted(variant.activation_amax.items())))
        if key not in seen:
            seen[key] = len(distinct)
            distinct.append(variant)
        clone_of.append(seen[key])
    return distinct, clone_of


__all__ = ["LayerEvidence", "calibrator_variants", "collect_evidence", "layer_evidence", "outlier_ratio",
           "weight_evidence"]
