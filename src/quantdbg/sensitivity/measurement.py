"""What a mode measured per layer, and how it becomes a ranked :class:`SensitivityReport`."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from quantdbg.evaluation import OutputMetrics
from quantdbg.model.footprint import footprint
from quantdbg.qdq import QuantizedModel
from quantdbg.sensitivity.config import Mode
from quantdbg.sensitivity.evaluator import VariantEvaluator, VariantResult
from quantdbg.sensitivity.evidence import LayerEvidence
from quantdbg.sensitivity.output_space import OutputSpace
from quantdbg.sensitivity.report import LayerSensitivity, QuantizedInput, SensitivityReport, TensorError


@dataclass
class Measurement:
    """What a mode measured, before ranking.

    Attributes:
        score: Layer -> ranking key (larger = more sensitive).
        value: Layer -> the measured quantity behind the score.
        metrics: Layer -> output metrics of its variant or of its own output.
        input_metrics: Cumulative mode: layer -> the error of its worst input.
        evidence: Layer -> its evidence (filled in after the mode ran).
        baseline: The fully quantized model's evaluation (None when not run).
        reference_value: The FP32 model's task metric (None when not evaluated).
        tensors: Cumulative mode: every compared tensor.
        metric_name: What ``value`` is.
        higher_is_better: Its direction.
        output_space: The output-space ranking (filled in after the mode ran; None when not run).
    """

    score: dict[str, float]
    value: dict[str, float]
    metrics: dict[str, OutputMetrics | None]
    input_metrics: dict[str, OutputMetrics | None] = field(default_factory=dict)
    evidence: dict[str, LayerEvidence] = field(default_factory=dict)
    baseline: VariantResult | None = None
    reference_value: float | None = None
    tensors: tuple[TensorError, ...] = ()
    metric_name: str = "sqnr"
    higher_is_better: bool = True
    output_space: OutputSpace | None = None

    def report(self, evaluator: VariantEvaluator, mode: Mode, seconds: float,
               fingerprint: str) -> SensitivityReport:
        """The report: layers ranked by score (ties keep graph order; NaN scores sink)."""
        order = {layer: i for i, layer in enumerate(evaluator.layers)}
        ranked = sorted(evaluator.layers, key=lambda n: (-_sortable(self.score[n]), order[n]))
        layers = tuple(LayerSensitivity(
            node, _op_type(evaluator.qmodel, node), quantized_inputs(evaluator.qmodel, node), rank + 1,
            self.score[node], self.value[node], self.metrics.get(node), self.input_metrics.get(node),
            self.evidence.get(node)) for rank, node in enumerate(ranked))
        baseline = self.baseline
        return SensitivityReport(
            mode, self.metric_name, self.higher_is_better, layers,
            None if baseline is None else baseline.comparison, None if baseline is None else baseline.value,
            self.reference_value, self.tensors, evaluator.n_samples, evaluator.n_passes, round(seconds, 3),
            fingerprint, self.output_space, footprint(evaluator.fp_model))


def _sortable(score: float) -> float:
    return -math.inf if math.isnan(score) else score


def _op_type(qmodel: QuantizedModel, node: str) -> str:
    return qmodel.records_of(node)[0].op_type


def quantized_inputs(qmodel: QuantizedModel, node: str) -> tuple[QuantizedInput, ...]:
    """The quantized inputs of ``node``, from its records."""
    return tuple(QuantizedInput(r.input_index, r.tensor, r.kind, r.calibrator, float(min(r.scale)),
                                float(max(r.scale)), len(r.scale)) for r in qmodel.records_of(node))


__all__ = ["Measurement", "quantized_inputs"]
