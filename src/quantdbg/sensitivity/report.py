"""The result of a sensitivity analysis: every quantized layer, ranked, with its inputs and evidence.

A :class:`SensitivityReport` is the ``quantdbg.sensitivity/1`` document (``analyze --out``).
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import Any

from quantdbg import _display, _json
from quantdbg._json import Serializable
from quantdbg.config import TensorKind
from quantdbg.errors import ConfigError, check_choice, unknown
from quantdbg.evaluation import Comparison, OutputMetrics
from quantdbg.model.footprint import Footprint
from quantdbg.sensitivity.config import MODES, Mode
from quantdbg.sensitivity.evidence import LayerEvidence
from quantdbg.sensitivity.output_space import OutputSpace
from quantdbg.sensitivity.ranks import RankAgreement, fuse_rankings, rank_agreement

SCORE_MEANING: Mapping[str, str] = MappingProxyType({
    "isolated": "metric loss with only this layer quantized (-metric when higher is better)",
    "leave-one-out": "metric gain from taking only this layer out of INT8 (metric when higher is better)",
    "local": "-SQNR (dB) of the layer's own output, fed FP32 inputs through its Q/DQ pairs",
    "cumulative": "noise-to-signal ratio the layer adds: NSR(output) - max NSR(inputs), full INT8 model",
})
"""Mode -> what ``LayerSensitivity.score`` measures in it."""


@dataclass(frozen=True)
class QuantizedInput(Serializable):
    """One quantized input of a layer.

    Attributes:
        index: Input index on the node.
        tensor: FP32 tensor name.
        kind: Weight or activation.
        calibrator: What chose the range.
        scale_min: Smallest scale (the scale, for per-tensor pairs).
        scale_max: Largest scale.
        channels: Number of scales (1 per tensor).
    """

    index: int
    tensor: str
    kind: TensorKind
    calibrator: str
    scale_min: float
    scale_max: float
    channels: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", TensorKind(self.kind))  # also from plain strings


@dataclass(frozen=True)
class LayerSensitivity(Serializable):
    """How much one quantized layer hurts, with the evidence for why.

    Attributes:
        node: ONNX node name.
        op_type: Its op type.
        inputs: Its quantized inputs (tensors, scales, calibrators).
        rank: 1 for the most sensitive layer.
        score: The ranking key, larger = more sensitive (mode-specific; see
            :attr:`SensitivityReport.score_meaning`).
        value: The measured quantity behind ``score`` (task metric of the variant; local SQNR;
            added noise-to-signal ratio).
        metrics: Output metrics of the variant against FP32 (isolated / leave-one-out), or of the
            layer's own output (local / cumulative).
        input_metrics: Cumulative mode: the error already present in the layer's worst input.
        evidence: Weight/activation evidence (None when not computed).
    """

    node: str
    op_type: str
    inputs: tuple[QuantizedInput, ...]
    rank: int
    score: float
    value: float
    metrics: OutputMetrics | None = None
    input_metrics: OutputMetrics | None = None
    evidence: LayerEvidence | None = None


@dataclass(frozen=True)
class LayerEvidenceEntry(Serializable):
    """One quantized layer's inputs and evidence, without a ranking.

    Attributes:
        node: ONNX node name.
        inputs: Its quantized inputs (tensors, scales, calibrators).
        evidence: Weight/activation evidence.
    """

    node: str
    inputs: tuple[QuantizedInput, ...]
    evidence: LayerEvidence


@dataclass(frozen=True)
class EvidenceReport(Serializable):
    """Every quantized layer's evidence, without a ranking (:func:`~quantdbg.sensitivity.analyze_evidence`):
    what the per-tensor calibrator choice (:func:`~quantdbg.sensitivity.suggest_calibrators`) reads.

    Attributes:
        layers: Every quantized layer, in graph order.
    """

    layers: tuple[LayerEvidenceEntry, ...]


@dataclass(frozen=True)
class TensorError(Serializable):
    """Cumulative mode: one intermediate tensor of the quantized model against FP32.

    Attributes:
        tensor: FP32 tensor name.
        node: The node producing it ("" for a graph input).
        op_type: That node's op type.
        metrics: Error of the quantized model's tensor.
    """

    tensor: str
    node: str
    op_type: str
    metrics: OutputMetrics


@_json.document("quantdbg.sensitivity", 1)
@dataclass(frozen=True, repr=False)
class SensitivityReport(_display.Displayable, Serializable):
    """Per-layer sensitivity, most sensitive first (the ``quantdbg.sensitivity/1`` document).

    Attributes:
        mode: The analysis mode.
        metric: The metric behind isolated / leave-one-out scores (``"sqnr (dB)"``, a task metric).
        higher_is_better: Its direction.
        layers: Every quantized layer, ranked.
        baseline: Outputs of the fully quantized model against FP32 (None in local mode).
        baseline_value: Task metric of the fully quantized model (None when not evaluated).
        reference_value: Task metric of the FP32 model (None when not evaluated).
        tensors: Cumulative mode: every compared intermediate tensor, in graph order.
        n_samples: Evaluation samples.
        n_passes: Full passes over the evaluation data (FP32 reference included).
        seconds: Wall time of the analysis (this run; a resumed run counts only its own part).
        fingerprint: Hash of the models, data, mode and metric (for resuming).
        output_space: Local / cumulative modes: each layer alone in INT8, scored on the model's
            outputs (None when not run). With it the JSON form adds ``fused_ranking`` and
            ``agreement`` (derived).
        footprint: The model's weight bytes and the process's peak RSS when the result was made
            (None in files written before it was recorded).

    Raises:
        ConfigError: Unknown mode.
    """

    mode: Mode
    metric: str
    higher_is_better: bool
    layers: tuple[LayerSensitivity, ...]
    baseline: Comparison | None = None
    baseline_value: float | None = None
    reference_value: float | None = None
    tensors: tuple[TensorError, ...] = ()
    n_samples: int = 0
    n_passes: int = 0
    seconds: float = 0.0
    fingerprint: str = ""
    output_space: OutputSpace | None = None
    footprint: Footprint | None = field(default=None, compare=False, metadata=_json.optional())

    def __post_init__(self) -> None:
        check_choice("sensitivity mode", self.mode, MODES)
        nodes = [layer.node for layer in self.layers]
        if len(set(nodes)) != len(nodes):
            raise ConfigError("SensitivityReport.layers must hold each layer once.")
        if self.output_space is not None and set(self.output_space.ranking) != set(nodes):
            raise ConfigError("SensitivityReport.output_space must rank the same layers as the report.")

    def __json_encode__(self) -> dict[str, Any]:
        # Reports without an output-space ranking keep the form they had before it existed.
        out = {f.name: _json.encode(getattr(self, f.name)) for f in fields(self)
               if _json.stored(self, f) and (f.name != "output_space" or self.output_space is not None)}
        extra: dict[str, Any] = {"score_meaning": self.score_meaning, "ranking": self.ranking}
        if self.output_space is not None:
            extra.update(fused_ranking=self.fused_ranking, agreement=self.agreement)
        return {**out, **_json.encode(extra)}

    @property
    def ranking(self) -> tuple[str, ...]:
        """Node names, most sensitive first (by the mode's score)."""
        return tuple(layer.node for layer in self.layers)

    @property
    def fused_ranking(self) -> tuple[str, ...]:
        """The ranking the fallback search walks: the reciprocal-rank fusion of :attr:`ranking` and
        the output-space ranking (:func:`~quantdbg.sensitivity.ranks.fuse_rankings`), or
        :attr:`ranking` when there is no output-space ranking."""
        if self.output_space is None:
            return self.ranking
        return fuse_rankings(self.ranking, self.output_space.ranking)

    @property
    def agreement(self) -> RankAgreement | None:
        """Where the mode's and the output-space rankings disagree (None without the latter)."""
        if self.output_space is None:
            return None
        return rank_agreement(self.ranking, self.output_space.ranking)

    @property
    def score_meaning(self) -> str:
        """What ``LayerSensitivity.score`` measures in this mode."""
        return SCORE_MEANING[self.mode]

    def top(self, k: int) -> tuple[str, ...]:
        """The ``k`` most sensitive node names."""
        return self.ranking[:k]

    def layer(self, node: str) -> LayerSensitivity:
        """The entry of ``node``.

        Raises:
            ModelError: ``node`` is not a quantized layer of the report.
        """
        for entry in self.layers:
            if entry.node == node:
                return entry
        raise unknown("quantized layer", node, self.ranking)


__all__ = ["SCORE_MEANING", "EvidenceReport", "LayerEvidenceEntry", "LayerSensitivity", "QuantizedInput",
           "SensitivityReport", "TensorError"]
