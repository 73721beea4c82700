"""The ``cumulative`` mode: every intermediate tensor of the fully quantized model against FP32.

The FP32 model and the switchable quantized model run side by side in one paired graph; tensors
are paired through the records and node identities. A layer's score is the noise-to-signal ratio
it adds: that of its output minus that of its worst input.
"""
from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import numpy as np
import onnx

from quantdbg._journal import Journal
from quantdbg.config import TensorKind
from quantdbg.data import CalibrationData
from quantdbg.evaluation import OutputMetrics
from quantdbg.evaluation.metrics import MetricAccumulator
from quantdbg.model.graph import value_types
from quantdbg.quant_math import NSR_CAP, nsr
from quantdbg.sensitivity.config import SensitivityConfig
from quantdbg.sensitivity.graphs import paired_graph
from quantdbg.sensitivity.measurement import Measurement
from quantdbg.sensitivity.reductions import DataPass, reduce_outputs, sums_to_metrics
from quantdbg.sensitivity.report import TensorError
from quantdbg.variants.evaluator import VariantEvaluator, VariantResult


@dataclass(frozen=True)
class TensorPair:
    """An FP32 tensor and the quantized model's tensor holding the same quantity.

    Attributes:
        fp: FP32 tensor name.
        quant: The switchable quantized model's tensor name.
        node: The node producing both.
        op_type: Its op type.
    """

    fp: str
    quant: str
    node: str
    op_type: str


def cumulative_pairs(evaluator: VariantEvaluator) -> list[TensorPair]:
    """FP32 tensor <-> quantized-model tensor, node by node (inserted Q/DQ and switches excluded)."""
    qmodel, switch = evaluator.qmodel, evaluator.switch
    inserted = {r.dequantize_node for r in qmodel.records} | {r.quantize_node for r in qmodel.records}
    fp_nodes = {n.name: n for n in evaluator.fp_model.graph.node}
    types = value_types(evaluator.fp_model)
    pairs = []
    for node in switch.model.graph.node:
        fp_node = fp_nodes.get(node.name)
        if node.name in inserted or fp_node is None or fp_node.op_type != node.op_type:
            continue
        for fp_out, q_out in zip(fp_node.output, node.output, strict=False):
            if fp_out and types.get(fp_out) == onnx.TensorProto.FLOAT:
                pairs.append(TensorPair(fp_out, q_out, node.name, node.op_type))
    return pairs


def measure_cumulative(evaluator: VariantEvaluator, config: SensitivityConfig,
                       journal: Journal) -> Measurement:
    """Compares every paired tensor in one pass and scores the noise each layer adds.

    Args:
        evaluator: The models and data.
        config: The analysis settings (``progress``).
        journal: The journal (one pass needs no resuming).

    Returns:
        The measurement, with every compared tensor and the fully quantized model's outputs.
    """
    pairs = cumulative_pairs(evaluator)
    graph = paired_graph(evaluator.fp_model, evaluator.switch.model, {p.fp: p.quant for p in pairs})
    data = evaluator.data
    evaluator.data = _WithSwitches(data, evaluator.switch.feed(evaluator.layers))
    try:
        also = (*graph.quant_outputs, *graph.quant_outputs.values())
        reduced = reduce_outputs(evaluator, graph.model, graph.reductions,
                                 DataPass("sensitivity (cumulative)", config.progress, also=also))
    finally:
        evaluator.data = data
    outputs = MetricAccumulator()
    for batch in reduced.kept:
        outputs.update({fp: batch[fp] for fp in graph.quant_outputs},
                       {fp: batch[q] for fp, q in graph.quant_outputs.items()})
    tensor_metrics = {fp: sums_to_metrics(sums) for fp, sums in reduced.sums.items()}
    tensors = tuple(TensorError(p.fp, p.node, p.op_type, tensor_metrics[p.fp]) for p in pairs)
    return _added_noise(evaluator, tensor_metrics, tensors, outputs)


class _WithSwitches:
    """Re-iterable data whose feeds also carry the switch values."""

    def __init__(self, data: CalibrationData, switches: Mapping[str, np.ndarray]) -> None:
        self.data = data
        self.switches = switches

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        for feed in self.data:
            yield {**feed, **self.switches}


def _nsr(m: OutputMetrics) -> float:
    """Noise-to-signal power ratio from SQNR (capped at NSR_CAP for a zero or broken signal)."""
    return NSR_CAP if m.nonfinite else min(NSR_CAP, nsr(m.sqnr_db))


def _added_noise(evaluator: VariantEvaluator, tensor_metrics: Mapping[str, OutputMetrics],
                 tensors: tuple[TensorError, ...], outputs: MetricAccumulator) -> Measurement:
    fp_nodes = {n.name: n for n in evaluator.fp_model.graph.node}
    score, value, metrics, inputs = {}, {}, {}, {}
    for layer in evaluator.layers:
        outs = [tensor_metrics[t] for t in fp_nodes[layer].output if t in tensor_metrics]
        ins = [tensor_metrics[r.tensor] for r in evaluator.qmodel.records_of(layer)
               if r.kind is TensorKind.ACTIVATION and r.tensor in tensor_metrics]
        out_m = min(outs, key=lambda m: m.sqnr_db) if outs else None
        in_m = min(ins, key=lambda m: m.sqnr_db) if ins else None
        added = (_nsr(out_m) if out_m else math.nan) - (_nsr(in_m) if in_m else 0.0)
        score[layer], value[layer], metrics[layer], inputs[layer] = added, added, out_m, in_m
    comparison = outputs.result()
    baseline = VariantResult(comparison, comparison.total.sqnr_db)
    return Measurement(score, value, metrics, inputs, baseline=baseline, tensors=tensors,
                       metric_name="added noise-to-signal ratio")


__all__ = ["TensorPair", "cumulative_pairs", "measure_cumulative"]
