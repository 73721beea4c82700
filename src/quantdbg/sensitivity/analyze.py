"""Per-layer sensitivity analysis of a Q/DQ model against its FP32 original.

Four modes, from cheapest to most faithful:

* ``local``: each layer's own output error when it reads FP32 inputs through its Q/DQ pairs --
  one pass of a graph holding the FP32 model plus a quantized clone per layer (about 2x one FP32
  pass), the cheap ranking for large models;
* ``cumulative``: every intermediate tensor of the fully quantized model against FP32, paired
  through the records and node identities; a layer's score is the noise it adds (output
  noise-to-signal ratio minus that of its inputs), showing where error grows and where it jumps;
* ``isolated``: only that layer's pairs active, everything else FP32 (one pass per layer);
* ``leave-one-out``: everything quantized except that layer (one pass per layer).

Isolated and leave-one-out variants are feeds to ONE session of a switchable graph (see
:mod:`quantdbg._analysis`); the FP32 reference outputs are computed once; ``jobs=N`` spreads the
variants over N processes (each with its own session); an interrupted sweep resumes from
``results_path``, rewritten atomically after every layer.
"""
from __future__ import annotations

import hashlib
import json
import logging
import math
import multiprocessing
import os
import time
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal, get_args

import numpy as np
import onnx

from quantdbg._io import write_json_atomic
from quantdbg._progress import track
from quantdbg.backends import Runner, RunnerFactory
from quantdbg.config import Precision, TensorKind
from quantdbg.data import DEFAULT_BATCH_SIZE, CalibrationData, DataSource, as_data
from quantdbg.errors import ConfigError, ModelError, QuantDbgError
from quantdbg.evaluation import (
    Comparison,
    MetricAccumulator,
    MetricName,
    OutputMetric,
    OutputMetrics,
    TaskMetric,
    as_task_metric,
    concat_batches,
    float_from_json,
    float_to_json,
    json_float,
    metrics_from_sums,
)
from quantdbg.model import ModelSource, as_loaded, input_specs
from quantdbg.qdq import QuantizedModel
from quantdbg.quant_math import NSR_CAP, nsr
from quantdbg.sensitivity import evidence as _evidence
from quantdbg.sensitivity import graphs as _analysis
from quantdbg.sensitivity.evidence import LayerEvidence

logger = logging.getLogger(__name__)

Mode = Literal["isolated", "leave-one-out", "local", "cumulative"]
MODES: tuple[str, ...] = get_args(Mode)
REPORT_FORMAT = "quantdbg.sensitivity/1"
PROGRESS_FORMAT = "quantdbg.sensitivity-progress/1"
EVIDENCE_BATCHES = 2
"""Batches of the analysis data the calibrator comparison runs on (it needs no full pass)."""
_BASELINE = "__all_quantized__"


# --------------------------------------------------------------------------------------------
# Result types
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class QuantizedInput:
    """One quantized input of a layer.

    Attributes:
        index: Input index on the node.
        tensor: FP32 tensor name.
        kind: ``"weight"`` or ``"activation"``.
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
        object.__setattr__(self, "kind", TensorKind(self.kind))  # also from JSON's plain strings

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return dict(self.__dict__)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> QuantizedInput:
        """Inverse of :meth:`to_dict`."""
        return cls(**data)


@dataclass(frozen=True)
class LayerSensitivity:
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

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return {"node": self.node, "op_type": self.op_type, "inputs": [i.to_dict() for i in self.inputs],
                "rank": self.rank, "score": float_to_json(self.score), "value": float_to_json(self.value),
                "metrics": None if self.metrics is None else self.metrics.to_dict(),
                "input_metrics": None if self.input_metrics is None else self.input_metrics.to_dict(),
                "evidence": None if self.evidence is None else self.evidence.to_dict()}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LayerSensitivity:
        """Inverse of :meth:`to_dict`."""
        opt = lambda key, typ: None if data.get(key) is None else typ.from_dict(data[key])  # noqa: E731
        return cls(data["node"], data["op_type"], tuple(QuantizedInput.from_dict(i) for i in data["inputs"]),
                   int(data["rank"]), json_float(data["score"]),
                   json_float(data["value"]), opt("metrics", OutputMetrics),
                   opt("input_metrics", OutputMetrics), opt("evidence", LayerEvidence))


@dataclass(frozen=True)
class TensorError:
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

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return {"tensor": self.tensor, "node": self.node, "op_type": self.op_type,
                "metrics": self.metrics.to_dict()}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TensorError:
        """Inverse of :meth:`to_dict`."""
        return cls(data["tensor"], data["node"], data["op_type"], OutputMetrics.from_dict(data["metrics"]))


_SCORE_MEANING = {
    "isolated": "metric loss with only this layer quantized (-metric when higher is better)",
    "leave-one-out": "metric gain from taking only this layer out of INT8 (metric when higher is better)",
    "local": "-SQNR (dB) of the layer's own output, fed FP32 inputs through its Q/DQ pairs",
    "cumulative": "noise-to-signal ratio the layer adds: NSR(output) - max NSR(inputs), full INT8 model",
}


@dataclass(frozen=True)
class SensitivityReport:
    """Per-layer sensitivity, most sensitive first.

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

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ConfigError(f"Unknown sensitivity mode {self.mode!r}; choose one of {', '.join(MODES)}.")

    @property
    def ranking(self) -> tuple[str, ...]:
        """Node names, most sensitive first."""
        return tuple(layer.node for layer in self.layers)

    @property
    def score_meaning(self) -> str:
        """What ``LayerSensitivity.score`` measures in this mode."""
        return _SCORE_MEANING[self.mode]

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
        from quantdbg.errors import unknown

        raise unknown("quantized layer", node, self.ranking)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return {"format": REPORT_FORMAT, "mode": self.mode, "metric": self.metric,
                "higher_is_better": self.higher_is_better, "score_meaning": self.score_meaning,
                "ranking": list(self.ranking), "layers": [layer.to_dict() for layer in self.layers],
                "baseline": None if self.baseline is None else self.baseline.to_dict(),
                "baseline_value": float_to_json(self.baseline_value),
                "reference_value": float_to_json(self.reference_value),
                "tensors": [t.to_dict() for t in self.tensors], "n_samples": self.n_samples,
                "n_passes": self.n_passes, "seconds": self.seconds, "fingerprint": self.fingerprint}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SensitivityReport:
        """Inverse of :meth:`to_dict`.

        Raises:
            ConfigError: ``data`` is not a sensitivity report.
        """
        if data.get("format") != REPORT_FORMAT:
            raise ConfigError(f"Not a quantdbg sensitivity report (format {data.get('format')!r}, expected "
                              f"{REPORT_FORMAT!r}).")
        return cls(data["mode"], data["metric"], bool(data["higher_is_better"]),
                   tuple(LayerSensitivity.from_dict(x) for x in data["layers"]),
                   None if data.get("baseline") is None else Comparison.from_dict(data["baseline"]),
                   float_from_json(data.get("baseline_value")), float_from_json(data.get("reference_value")),
                   tuple(TensorError.from_dict(t) for t in data.get("tensors", ())), int(data["n_samples"]),
                   int(data["n_passes"]), float(data["seconds"]), data.get("fingerprint", ""))

    def write(self, path: str | os.PathLike) -> Path:
        """Writes :meth:`to_dict` as JSON atomically."""
        return write_json_atomic(path, self.to_dict())

    @classmethod
    def read(cls, path: str | os.PathLike) -> SensitivityReport:
        """Reads a report written by :meth:`write`.

        Raises:
            ConfigError: The file is missing, not JSON, or not a sensitivity report.
        """
        try:
            return cls.from_dict(json.loads(Path(path).read_text()))
        except (OSError, ValueError) as err:
            raise ConfigError(f"Cannot read sensitivity report {str(path)!r}: {err}") from err


def suggest_calibrators(report: SensitivityReport, only_changes: bool = True) -> dict[str, str]:
    """Per-tensor calibrator choice from a report's evidence (for ``CalibConfig.per_tensor``).

    For every activation tensor, the calibrator that minimises the summed local noise power
    (``10^(-SQNR/10)``) of the layers reading it -- several layers can read one tensor (e.g. the
    query, key and value projections), and one range serves them all.

    Args:
        report: A report computed with ``evidence=True``.
        only_changes: Leave out tensors whose best calibrator is the one already used.

    Returns:
        Exact-match glob (special characters escaped) -> calibrator name, in graph order.
    """
    noise: dict[str, dict[str, float]] = {}
    used: dict[str, str] = {}
    for layer in report.layers:
        candidates = layer.evidence.calibrator_sqnr if layer.evidence is not None else None
        for inp in layer.inputs:
            if inp.kind is not TensorKind.ACTIVATION or not candidates:
                continue
            used[inp.tensor] = inp.calibrator
            totals = noise.setdefault(inp.tensor, {})
            for name, sqnr in candidates.items():
                totals[name] = totals.get(name, 0.0) + nsr(sqnr)
    chosen = {t: min(sorted(c), key=c.__getitem__) for t, c in noise.items() if c}
    return {_glob_escape(t): m for t, m in chosen.items() if not only_changes or m != used.get(t)}


def _glob_escape(name: str) -> str:
    return "".join(f"[{c}]" if c in "*?[" else c for c in name)


# --------------------------------------------------------------------------------------------
# Variant evaluation (shared with the fallback search)
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class VariantResult:
    """One full evaluation of a model variant.

    Attributes:
        comparison: Its outputs against FP32 (None for model-file task metrics).
        value: The task metric.
    """

    comparison: Comparison | None
    value: float

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return {"comparison": None if self.comparison is None else self.comparison.to_dict(),
                "value": float_to_json(self.value)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> VariantResult:
        """Inverse of :meth:`to_dict`."""
        comparison = data.get("comparison")
        return cls(None if comparison is None else Comparison.from_dict(comparison),
                   json_float(data["value"]))


def default_runner_factory(threads: int = 0) -> RunnerFactory:
    """ONNX Runtime on the CPU with ``threads`` intra-op threads (0: all cores)."""
    from quantdbg.backends import OnnxrtRunnerFactory, OrtConfig

    return OnnxrtRunnerFactory(OrtConfig(intra_op_num_threads=threads))


def _check_layers(fp_model: onnx.ModelProto, qmodel: QuantizedModel) -> None:
    if not qmodel.records:
        raise ModelError("The Q/DQ model has no recorded Q/DQ pairs: nothing to analyse. Quantize it "
                         "with quantdbg.quantize() or read a quantized model with records_from_model().")
    nodes = {n.name: n.op_type for n in fp_model.graph.node}
    for layer in qmodel.layers:
        if layer not in nodes:
            from quantdbg.errors import unknown

            err = unknown("node", layer, list(nodes))
            raise ModelError(f"Quantized node {layer!r} is not in the FP32 model; pass the FP32 original of "
                             f"the Q/DQ model. {err}")


class VariantEvaluator:
    """Scores variants of a Q/DQ model -- any subset of its layers quantized -- on fixed data.

    Variants are feeds to one session of the switchable graph; the FP32 reference outputs are
    computed once, on first need. Model-file task metrics instead get each variant written out
    (layers not quantized are restored to FP32 by :func:`quantdbg.qdq.remove_qdq`).

    Args:
        fp_model: The FP32 original (path or ModelProto).
        qmodel: The Q/DQ model and its records.
        data: Evaluation data (``.npz`` path, arrays, or feeds).
        metric: Task metric or output-metric name.
        runner_factory: Makes the runners (default: ONNX Runtime on the CPU).
    """

    def __init__(self, fp_model: ModelSource, qmodel: QuantizedModel, data: DataSource,
                 metric: TaskMetric | MetricName = "sqnr",
                 runner_factory: RunnerFactory | None = None) -> None:
        self.fp_model = as_loaded(fp_model).proto
        self.qmodel = qmodel
        _check_layers(self.fp_model, qmodel)
        self.metric = as_task_metric(metric)
        self.data: CalibrationData = as_data(data, DEFAULT_BATCH_SIZE,
                                             inputs=list(input_specs(self.fp_model)))
        self.runner_factory = runner_factory or default_runner_factory()
        self.n_passes = 0
        self._switch: _analysis.SwitchGraph | None = None
        self._runner: Runner | None = None
        self._reference: list[dict[str, np.ndarray]] | None = None

    @property
    def layers(self) -> tuple[str, ...]:
        """Quantized layers, in graph order."""
        return self.qmodel.layers

    @property
    def switch(self) -> _analysis.SwitchGraph:
        """The switchable graph (built on first use)."""
        if self._switch is None:
            self._switch = _analysis.switch_graph(self.qmodel, self.fp_model)
        return self._switch

    def reference(self) -> list[dict[str, np.ndarray]]:
        """FP32 outputs per batch (one pass, then cached)."""
        if self._reference is None:
            self._reference = self._run_all(self.fp_model, {})
        return self._reference

    def _run_all(self, model: onnx.ModelProto, extra: Mapping[str, np.ndarray],
                 runner: Runner | None = None) -> list[dict[str, np.ndarray]]:
        own = runner is None
        runner = runner or self.runner_factory(model)
        try:
            runner.activate()
            self.n_passes += 1
            return [runner.infer({**feed, **extra}) for feed in self.data]
        finally:
            if own:
                runner.deactivate()

    def _switch_runner(self) -> Runner:
        if self._runner is None:
            self._runner = self.runner_factory(self.switch.model)
        return self._runner

    def detach(self) -> None:
        """Forgets (without closing) the session; a forked worker then builds its own."""
        self._runner = None

    def close(self) -> None:
        """Frees the session."""
        if self._runner is not None:
            self._runner.deactivate()
            self._runner = None

    def __enter__(self) -> VariantEvaluator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def score(self, outputs: list[dict[str, np.ndarray]]) -> VariantResult:
        """Scores a variant's per-batch outputs against the FP32 reference."""
        reference = self.reference()
        acc = MetricAccumulator()
        for ref, out in zip(reference, outputs, strict=True):
            acc.update(ref, out)
        comparison = acc.result()
        if isinstance(self.metric, OutputMetric) and self.metric.output is None:
            value = comparison.total.value(self.metric.metric)
        else:
            value = self.metric.from_outputs(concat_batches(outputs), concat_batches(reference))
        return VariantResult(comparison, float(value))

    def run(self, quantized: Collection[str]) -> VariantResult:
        """Evaluates the variant with exactly the layers in ``quantized`` in INT8.

        Raises:
            ModelError: A name is not a quantized layer.
        """
        unknown_layers = set(quantized) - set(self.layers)
        if unknown_layers:
            from quantdbg.errors import unknown

            raise unknown("quantized layer", sorted(unknown_layers)[0], self.layers)
        if self.metric.needs_model:
            return VariantResult(None, self.metric.evaluate_model(self.variant_model(quantized)))
        self.reference()
        outputs = self._run_all(self.switch.model, self.switch.feed(quantized), self._switch_runner())
        return self.score(outputs)

    def variant_model(self, quantized: Collection[str],
                      precision: Precision = Precision.FP32) -> onnx.ModelProto:
        """The Q/DQ model with only ``quantized`` layers in INT8, the others in ``precision``."""
        from quantdbg.qdq import remove_qdq

        off = [layer for layer in self.layers if layer not in set(quantized)]
        return remove_qdq(self.qmodel, off, precision).model if off else self.qmodel.model

    def run_model(self, model: onnx.ModelProto) -> VariantResult:
        """Evaluates any model with the FP32 model's inputs/outputs (e.g. the real mixed model)."""
        if self.metric.needs_model:
            return VariantResult(None, self.metric.evaluate_model(model))
        self.reference()
        return self.score(self._run_all(model, {}))

    def reference_value(self) -> float:
        """The task metric of the FP32 model."""
        if self.metric.needs_model:
            self.n_passes += 1
            return self.metric.evaluate_model(self.fp_model)
        ref = concat_batches(self.reference())
        return float(self.metric.from_outputs(ref, ref))

    def fingerprint(self, mode: str) -> str:
        """Hash of both models, the data, the metric and ``mode``."""
        digest = hashlib.sha256()
        digest.update(self.qmodel.model.SerializeToString())
        digest.update(self.fp_model.SerializeToString())
        digest.update(f"{mode}|{self.metric.describe()}".encode())
        for feed in self.data:
            for name in sorted(feed):
                digest.update(name.encode())
                digest.update(np.ascontiguousarray(feed[name]).tobytes())
        return digest.hexdigest()[:32]

    @property
    def n_samples(self) -> int:
        """Samples in the evaluation data (axis 0 of the first input, summed over batches)."""
        return sum(int(np.shape(next(iter(feed.values())))[0] or 1) for feed in self.data)


# --------------------------------------------------------------------------------------------
# The analysis
# --------------------------------------------------------------------------------------------

def analyze_sensitivity(fp_model: ModelSource, qmodel: QuantizedModel, data: DataSource, *,
                        mode: Mode = "local", metric: TaskMetric | MetricName = "sqnr",
                        runner_factory: RunnerFactory | None = None, jobs: int = 1, progress: bool = False,
                        results_path: str | os.PathLike | None = None,
                        evidence: bool = True) -> SensitivityReport:
    """Ranks the quantized layers of ``qmodel`` by how much INT8 hurts them.

    Args:
        fp_model: The FP32 original (path or ModelProto; node names as in ``qmodel``).
        qmodel: The Q/DQ model and its records (:func:`quantdbg.quantize`, or
            :func:`quantdbg.qdq.records_from_model` for models quantized elsewhere).
        data: Evaluation data.
        mode: ``"local"``, ``"cumulative"``, ``"isolated"`` or ``"leave-one-out"`` (module doc).
        metric: What isolated / leave-one-out variants are scored by: an output-metric name or
            a :class:`~quantdbg.evaluate.TaskMetric` (e.g. a command).
        runner_factory: Makes the runners (default: ONNX Runtime, CPU).
        jobs: Processes evaluating isolated / leave-one-out variants in parallel.
        progress: Show a progress bar (else log lines at DEBUG).
        results_path: JSON file holding the sweep's progress and then the report; a sweep
            interrupted earlier resumes from it (it must belong to the same models, data, mode and
            metric).
        evidence: Add the weight / activation / calibrator evidence to every layer.

    Returns:
        The report, most sensitive layer first.

    Raises:
        ConfigError: Unknown mode, ``jobs < 1``, or ``results_path`` belongs to another analysis.
        ModelError: The models do not match each other or their records.
        DataError: The data does not match the model.
    """
    if mode not in MODES:
        raise ConfigError(f"Unknown sensitivity mode {mode!r}; choose one of {', '.join(MODES)}.")
    if jobs < 1:
        raise ConfigError(f"jobs must be >= 1, got {jobs}.")
    start = time.perf_counter()
    if runner_factory is None and jobs > 1:
        runner_factory = default_runner_factory(max(1, (os.cpu_count() or 1) // jobs))
    with VariantEvaluator(fp_model, qmodel, data, metric, runner_factory) as evaluator:
        fingerprint = evaluator.fingerprint(mode) if results_path is not None else ""
        state = _ResultsFile.open(results_path, fingerprint, mode)
        if state.report is not None:  # finished earlier; evidence is not part of the fingerprint
            if not evidence or all(layer.evidence is not None for layer in state.report.layers):
                return state.report
            found_evidence = _layer_evidence(evaluator, progress)
            report = replace(state.report, layers=tuple(replace(layer, evidence=found_evidence[layer.node])
                                                        for layer in state.report.layers))
            report.write(state.path)  # type: ignore[arg-type]
            return report
        if mode == "local":
            found = _local(evaluator, progress)
        elif mode == "cumulative":
            found = _cumulative(evaluator, progress)
        else:
            found = _sweep(evaluator, mode, jobs, progress, state)
        if evidence:
            found = found.with_evidence(_layer_evidence(evaluator, progress))
        report = found.report(evaluator, mode, time.perf_counter() - start, fingerprint)
    if results_path is not None:
        report.write(results_path)
    return report


@dataclass
class _Found:
    """What a mode measured, before ranking."""

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

    def with_evidence(self, evidence: dict[str, LayerEvidence]) -> _Found:
        self.evidence = evidence
        return self

    def report(self, evaluator: VariantEvaluator, mode: Mode, seconds: float,
               fingerprint: str) -> SensitivityReport:
        order = {layer: i for i, layer in enumerate(evaluator.layers)}
        # Stable: ties keep graph order; NaN scores sink to the bottom.
        ranked = sorted(evaluator.layers, key=lambda n: (-_sortable(self.score[n]), order[n]))
        layers = tuple(LayerSensitivity(
            node, _op_type(evaluator.qmodel, node), _inputs(evaluator.qmodel, node), rank + 1,
            self.score[node], self.value[node], self.metrics.get(node), self.input_metrics.get(node),
            self.evidence.get(node)) for rank, node in enumerate(ranked))
        baseline = self.baseline
        return SensitivityReport(
            mode, self.metric_name, self.higher_is_better, layers,
            None if baseline is None else baseline.comparison, None if baseline is None else baseline.value,
            self.reference_value, self.tensors, evaluator.n_samples, evaluator.n_passes, round(seconds, 3),
            fingerprint)


def _sortable(score: float) -> float:
    return -math.inf if math.isnan(score) else score


def _op_type(qmodel: QuantizedModel, node: str) -> str:
    return qmodel.records_of(node)[0].op_type


def _inputs(qmodel: QuantizedModel, node: str) -> tuple[QuantizedInput, ...]:
    return tuple(QuantizedInput(r.input_index, r.tensor, r.kind, r.calibrator, float(min(r.scale)),
                                float(max(r.scale)), len(r.scale)) for r in qmodel.records_of(node))


# ----- isolated / leave-one-out -------------------------------------------------------------

def _variant_of(mode: str, layers: Sequence[str], layer: str) -> tuple[str, ...]:
    if layer == _BASELINE:
        return tuple(layers)
    return (layer,) if mode == "isolated" else tuple(n for n in layers if n != layer)


def _sweep(evaluator: VariantEvaluator, mode: Mode, jobs: int, progress: bool,
           state: _ResultsFile) -> _Found:
    layers = evaluator.layers
    todo = [n for n in (_BASELINE, *layers) if n not in state.done]
    if not evaluator.metric.needs_model:
        evaluator.reference()  # before any fork: workers inherit it
    results = dict(state.done)
    items = _evaluate_parallel(evaluator, mode, todo, jobs) if jobs > 1 and len(todo) > 1 \
        else ((n, evaluator.run(_variant_of(mode, layers, n))) for n in todo)
    for name, result in track(items, total=len(todo), desc=f"sensitivity ({mode})", enabled=progress,
                              unit="variant"):
        results[name] = result
        state.record(name, result)
    hib = evaluator.metric.higher_is_better
    sign = (-1.0 if hib else 1.0) * (1.0 if mode == "isolated" else -1.0)
    found = _Found({n: sign * results[n].value for n in layers}, {n: results[n].value for n in layers},
                   {n: _total(results[n]) for n in layers},
                   baseline=results[_BASELINE], metric_name=evaluator.metric.name, higher_is_better=hib)
    if not evaluator.metric.needs_model:
        found.reference_value = evaluator.reference_value()
    return found


def _total(result: VariantResult) -> OutputMetrics | None:
    return None if result.comparison is None else result.comparison.total


_WORKER: dict[str, Any] = {}


def _worker_init() -> None:
    _WORKER["evaluator"].detach()  # the inherited session belongs to the parent


def _worker_run(mode: str, name: str) -> tuple[str, dict[str, Any]]:
    evaluator: VariantEvaluator = _WORKER["evaluator"]
    return name, evaluator.run(_variant_of(mode, evaluator.layers, name)).to_dict()


def _evaluate_parallel(evaluator: VariantEvaluator, mode: str, names: Sequence[str],
                       jobs: int) -> Iterable[tuple[str, VariantResult]]:
    """Evaluates variants in ``jobs`` forked processes, each with its own session."""
    if "fork" not in multiprocessing.get_all_start_methods():
        logger.warning("jobs=%d needs the 'fork' start method, absent here; evaluating serially.", jobs)
        for name in names:
            yield name, evaluator.run(_variant_of(mode, evaluator.layers, name))
        return
    _WORKER["evaluator"] = evaluator
    try:
        context = multiprocessing.get_context("fork")
        with ProcessPoolExecutor(jobs, mp_context=context, initializer=_worker_init) as pool:
            futures = [pool.submit(_worker_run, mode, name) for name in names]
            for future in as_completed(futures):
                name, result = future.result()
                yield name, VariantResult.from_dict(result)
    finally:
        _WORKER.clear()


class _ResultsFile:
    """The resumable progress of a sweep, rewritten atomically after every variant."""

    def __init__(self, path: Path | None, fingerprint: str, mode: str) -> None:
        self.path = path
        self.fingerprint = fingerprint
        self.mode = mode
        self.done: dict[str, VariantResult] = {}
        self.report: SensitivityReport | None = None

    @classmethod
    def open(cls, path: str | os.PathLike | None, fingerprint: str, mode: str) -> _ResultsFile:
        state = cls(None if path is None else Path(path), fingerprint, mode)
        if state.path is None or not state.path.exists():
            return state
        try:
            data = json.loads(state.path.read_text())
        except (OSError, ValueError) as err:
            raise ConfigError(f"Cannot resume from {str(state.path)!r}: {err}. Delete it or choose another "
                              "results path.") from err
        if data.get("fingerprint") != fingerprint:
            raise ConfigError(f"Results file {str(state.path)!r} belongs to another analysis (other models, "
                              "data, mode or metric); delete it or choose another results path.")
        if data.get("format") == REPORT_FORMAT:
            state.report = SensitivityReport.from_dict(data)
        else:
            state.done = {k: VariantResult.from_dict(v) for k, v in data.get("done", {}).items()}
            logger.info("resuming %s sweep: %d variant(s) already done", mode, len(state.done))
        return state

    def record(self, name: str, result: VariantResult) -> None:
        self.done[name] = result
        if self.path is not None:
            write_json_atomic(self.path, {"format": PROGRESS_FORMAT, "fingerprint": self.fingerprint,
                                          "mode": self.mode,
                                          "done": {k: v.to_dict() for k, v in self.done.items()}})


# ----- local ---------------------------------------------------------------------------------

def _sums_to_metrics(sums: Sequence[float]) -> OutputMetrics:
    signal, noise, test, max_abs, count = sums
    return metrics_from_sums(signal, noise, (signal + test - noise) / 2.0, test, max_abs, int(count))


def _reduce(evaluator: VariantEvaluator, model: onnx.ModelProto, groups: Mapping[Any, tuple[str, ...]],
            max_batches: int | None, progress: bool, desc: str,
            also: Sequence[str] = ()) -> tuple[dict[Any, list[float]], list[dict[str, np.ndarray]]]:
    """Runs ``model`` over the data and accumulates each group's :data:`_analysis.REDUCTIONS`.

    Per-batch float32 sums are added in float64. Returns group -> [signal, noise, test, max_abs,
    count] and, per batch, the outputs named in ``also``.
    """
    names = [n for outs in groups.values() for n in outs]
    totals = {key: [0.0, 0.0, 0.0, 0.0, 0.0] for key in groups}
    kept: list[dict[str, np.ndarray]] = []
    with evaluator.runner_factory(model) as runner:
        evaluator.n_passes += 1
        for index, feed in enumerate(track(evaluator.data, desc=desc, enabled=progress)):
            if max_batches is not None and index >= max_batches:
                break
            values = runner.infer(feed, [*names, *also])
            for key, outs in groups.items():
                sums, batch = totals[key], [float(values[n]) for n in outs]
                sums[0] += batch[0]
                sums[1] += batch[1]
                sums[2] += batch[2]
                peak = max(abs(batch[3]), abs(batch[4]))
                sums[3] = max(sums[3], peak) if math.isfinite(peak) else math.inf
                sums[4] += batch[5]
            if also:
                kept.append({n: values[n] for n in also})
    return totals, kept


def _run_local(evaluator: VariantEvaluator, variants: Sequence[_analysis.LocalVariant],
               max_batches: int | None, progress: bool, desc: str) -> dict[int, OutputMetrics]:
    """Runs a local graph; returns variant index -> metrics of the clone's outputs (pooled)."""
    graph = _analysis.local_graph(evaluator.fp_model, evaluator.qmodel, variants)
    totals, _ = _reduce(evaluator, graph.model, graph.outputs, max_batches, progress, desc)
    pooled: dict[int, list[float]] = {}
    for (variant, _), sums in totals.items():  # a layer with several outputs: pool them
        acc = pooled.setdefault(variant, [0.0, 0.0, 0.0, 0.0, 0.0])
        for i in (0, 1, 2, 4):
            acc[i] += sums[i]
        acc[3] = max(acc[3], sums[3])
    return {v: _sums_to_metrics(s) for v, s in pooled.items()}


def _local(evaluator: VariantEvaluator, progress: bool) -> _Found:
    variants = [_analysis.LocalVariant(layer, "recorded", {}) for layer in evaluator.layers]
    found = _run_local(evaluator, variants, None, progress, "sensitivity (local)")
    metrics = {variants[i].layer: m for i, m in found.items()}
    value = {n: metrics[n].sqnr_db if n in metrics else math.nan for n in evaluator.layers}
    return _Found({n: -v for n, v in value.items()}, value, dict(metrics), metric_name="local sqnr (dB)")


# ----- cumulative ----------------------------------------------------------------------------

@dataclass(frozen=True)
class _Pair:
    fp: str
    quant: str
    node: str
    op_type: str


def _cumulative_pairs(evaluator: VariantEvaluator) -> list[_Pair]:
    """FP32 tensor <-> quantized-model tensor, node by node (inserted Q/DQ and switches excluded)."""
    qmodel, switch = evaluator.qmodel, evaluator.switch
    inserted = {r.dequantize_node for r in qmodel.records} | {r.quantize_node for r in qmodel.records}
    fp_nodes = {n.name: n for n in evaluator.fp_model.graph.node}
    types = _analysis.float_value_types(evaluator.fp_model)
    pairs = []
    for node in switch.model.graph.node:
        fp_node = fp_nodes.get(node.name)
        if node.name in inserted or fp_node is None or fp_node.op_type != node.op_type:
            continue
        for fp_out, q_out in zip(fp_node.output, node.output, strict=False):
            if fp_out and types.get(fp_out) == onnx.TensorProto.FLOAT:
                pairs.append(_Pair(fp_out, q_out, node.name, node.op_type))
    return pairs


def _cumulative(evaluator: VariantEvaluator, progress: bool) -> _Found:
    pairs = _cumulative_pairs(evaluator)
    graph = _analysis.paired_graph(evaluator.fp_model, evaluator.switch.model, {p.fp: p.quant for p in pairs})
    data = evaluator.data
    evaluator.data = _WithSwitches(data, evaluator.switch.feed(evaluator.layers))
    try:
        also = [*graph.quant_outputs, *graph.quant_outputs.values()]
        totals, kept = _reduce(evaluator, graph.model, graph.reductions, None, progress,
                               "sensitivity (cumulative)", also)
    finally:
        evaluator.data = data
    outputs = MetricAccumulator()
    for batch in kept:
        outputs.update({fp: batch[fp] for fp in graph.quant_outputs},
                       {fp: batch[q] for fp, q in graph.quant_outputs.items()})
    tensor_metrics = {fp: _sums_to_metrics(sums) for fp, sums in totals.items()}
    tensors = tuple(TensorError(p.fp, p.node, p.op_type, tensor_metrics[p.fp]) for p in pairs)
    return _cumulative_found(evaluator, tensor_metrics, tensors, outputs)


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


def _cumulative_found(evaluator: VariantEvaluator, tensor_metrics: Mapping[str, OutputMetrics],
                      tensors: tuple[TensorError, ...], outputs: MetricAccumulator) -> _Found:
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
    return _Found(score, value, metrics, inputs, baseline=baseline, tensors=tensors,
                  metric_name="added noise-to-signal ratio")


# ----- evidence ------------------------------------------------------------------------------

def _evidence_stats(evaluator: VariantEvaluator) -> dict[str, Any]:
    """Activation statistics with histograms: from the calibration when it kept them, else collected."""
    records = evaluator.qmodel.records
    tensors = list(dict.fromkeys(r.tensor for r in records if r.kind is TensorKind.ACTIVATION))
    calibration = evaluator.qmodel.calibration
    stats = dict(calibration.stats) if calibration is not None else {}
    missing = [t for t in tensors if t not in stats or stats[t].hist is None]
    if missing:
        from quantdbg.calibration import CollectConfig, collect_stats

        evaluator.n_passes += 1
        stats.update(collect_stats(evaluator.fp_model, evaluator.data, missing,
                                   CollectConfig(histogram=True, max_batches=EVIDENCE_BATCHES)))
    return {t: stats[t] for t in tensors if t in stats}


def _layer_evidence(evaluator: VariantEvaluator, progress: bool) -> dict[str, LayerEvidence]:
    try:
        stats = _evidence_stats(evaluator)
    except QuantDbgError as err:  # e.g. a tensor ORT cannot expose: evidence is optional
        logger.warning("activation evidence skipped: %s", err)
        stats = {}
    variants = _evidence.calibrator_variants(evaluator.qmodel, evaluator.layers, stats)
    found = _run_local(evaluator, variants, EVIDENCE_BATCHES, progress, "sensitivity (evidence)")
    local: dict[str, dict[str, float]] = {layer: {} for layer in evaluator.layers}
    for index, m in found.items():
        local[variants[index].layer][variants[index].label] = m.sqnr_db
    return {layer: _evidence.layer_evidence(evaluator.fp_model, evaluator.qmodel, layer, stats, local[layer])
            for layer in evaluator.layers}


__all__ = ["MODES", "LayerEvidence", "LayerSensitivity", "Mode", "QuantizedInput", "SensitivityReport",
           "TensorError", "VariantEvaluator", "VariantResult", "analyze_sensitivity",
           "default_runner_factory", "suggest_calibrators"]
