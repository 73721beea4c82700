"""Per-layer sensitivity analysis of a Q/DQ model against its FP32 original.

:func:`analyze_sensitivity` builds a :class:`~quantdbg.sensitivity.evaluator.VariantEvaluator`,
runs the mode (:mod:`quantdbg.sensitivity.modes`), adds the evidence and, for the modes that rank
by a layer's own error, the output-space ranking (:mod:`quantdbg.sensitivity.output_space`), and
ranks the layers into a :class:`~quantdbg.sensitivity.report.SensitivityReport`. With
``results_path`` the analysis keeps a journal (:mod:`quantdbg._journal`): each variant of a sweep
as it is evaluated, then the report, so an interrupted run resumes where it stopped and a finished
one returns its report. :func:`analyze_variants` runs the analysis of an evaluator through the
journal of the run it serves (``fallback``, ``auto``); :func:`analyze_evidence` only the evidence
(what the calibrator choice reads).
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import replace
from pathlib import Path

from quantdbg._fingerprint import compose, digest
from quantdbg._journal import Journal
from quantdbg.backends import RunnerFactory
from quantdbg.data import DataSource
from quantdbg.evaluation import TaskMetric
from quantdbg.evaluation.metrics import MetricName
from quantdbg.model.load import ModelSource
from quantdbg.qdq import QuantizedModel
from quantdbg.sensitivity.config import OUTPUT_SPACE_MODES, SensitivityConfig
from quantdbg.sensitivity.evaluator import VariantEvaluator, default_runner_factory
from quantdbg.sensitivity.evidence import collect_evidence
from quantdbg.sensitivity.journaled import JournaledEvaluator, analysis_metric, model_key
from quantdbg.sensitivity.measurement import quantized_inputs
from quantdbg.sensitivity.modes import measure
from quantdbg.sensitivity.output_space import measure_output_space
from quantdbg.sensitivity.report import EvidenceReport, LayerEvidenceEntry, SensitivityReport

_DEFAULT = SensitivityConfig()


def analyze_sensitivity(fp_model: ModelSource, qmodel: QuantizedModel, data: DataSource,
                        config: SensitivityConfig = _DEFAULT, *, metric: TaskMetric | MetricName = "sqnr",
                        runner_factory: RunnerFactory | None = None) -> SensitivityReport:
    """Ranks the quantized layers of ``qmodel`` by how much INT8 hurts them.

    Args:
        fp_model: The FP32 original (path or ModelProto; node names as in ``qmodel``).
        qmodel: The Q/DQ model and its records (:func:`quantdbg.quantize`, or
            :func:`quantdbg.qdq.records_from_model` for models quantized elsewhere).
        data: Evaluation data.
        config: Mode, parallel jobs, evidence, progress bars and the journal to resume from.
        metric: What isolated / leave-one-out variants are scored by: an output-metric name or
            a :class:`~quantdbg.evaluation.TaskMetric` (e.g. a command).
        runner_factory: Makes the runners (default: ONNX Runtime, CPU; with ``jobs > 1`` or an
            executor of several workers each worker gets an equal share of this machine's cores).

    Returns:
        The report, most sensitive layer first.

    Raises:
        ConfigError: ``config.results_path`` belongs to another analysis (the message names what
            differs), was written by an older quantdbg or was changed after it was written.
        FormatError: ``config.results_path`` exists but is not a journal.
        ModelError: The models do not match each other or their records.
        DataError: The data does not match the model.
    """
    start = time.perf_counter()
    parallel = config.executor.workers() if config.executor is not None else config.jobs
    if runner_factory is None and parallel > 1:
        runner_factory = default_runner_factory(max(1, (os.cpu_count() or 1) // parallel))
    with VariantEvaluator(fp_model, qmodel, data, metric, runner_factory) as evaluator:
        ingredients = evaluator.ingredients(config.mode) if config.results_path is not None else {}
        with Journal.open(config.results_path, "analyze", ingredients) as journal:
            found = journal.get(_REPORT)
            if found is not None:
                report = SensitivityReport.from_dict(found, journal.where)
                return _finished(evaluator, config, journal, report)
            fingerprint = compose(ingredients) if ingredients else ""
            report = _measured(evaluator, config, journal, fingerprint, start)
            journal.record(_REPORT, report.to_dict())
    return report


_REPORT = "report"
"""The journal key of the finished report."""


def _measured(evaluator: VariantEvaluator, config: SensitivityConfig, journal: Journal, fingerprint: str,
              start: float) -> SensitivityReport:
    found = measure(evaluator, config, journal)
    if config.evidence:
        found.evidence = collect_evidence(evaluator, config)
    if _wants_output_space(config):
        found.output_space = measure_output_space(evaluator, config.output_samples, config.progress,
                                                  config.executor)
    return found.report(evaluator, config.mode, time.perf_counter() - start, fingerprint)


def finished_report(path: str | os.PathLike) -> SensitivityReport | None:
    """The report an analysis with ``results_path=path`` finished with (None: absent or unfinished).

    Raises:
        ConfigError: The journal was written by an older quantdbg or changed after it was written.
        FormatError: The file is not a journal.
    """
    if not Path(path).exists():
        return None
    journal = Journal.read(path)
    found = journal.get(_REPORT)
    return None if found is None else SensitivityReport.from_dict(found, repr(os.fspath(path)))


def analyze_variants(evaluator: VariantEvaluator, config: SensitivityConfig) -> SensitivityReport:
    """:func:`analyze_sensitivity` of an evaluator's models, data, metric and runners.

    Through a :class:`~quantdbg.sensitivity.journaled.JournaledEvaluator`, the evaluator's journal
    keeps the report once finished, and until then every task-metric score of the user's code (so a
    resumed run makes none twice); ``config.results_path`` is then not used.
    """
    if not isinstance(evaluator, JournaledEvaluator):
        return analyze_sensitivity(evaluator.fp_model, evaluator.qmodel, evaluator.data, config,
                                   metric=evaluator.metric, runner_factory=evaluator.runner_factory)
    config = replace(config, results_path=None)
    journal, metric = evaluator.journal, analysis_metric(evaluator.metric, evaluator.journal)
    settings = json.dumps(replace(config, progress=False).to_dict(), sort_keys=True)
    key = f"analysis:{model_key(evaluator.qmodel.model)}:{digest(metric.identity(), settings)}"

    def analyze() -> SensitivityReport:
        return analyze_sensitivity(evaluator.fp_model, evaluator.qmodel, evaluator.data, config,
                                   metric=metric, runner_factory=evaluator.runner_factory)

    return journal.stored(key, analyze, SensitivityReport.to_dict, SensitivityReport.from_dict)


def analyze_evidence(evaluator: VariantEvaluator, config: SensitivityConfig = _DEFAULT) -> EvidenceReport:
    """Only each calibrator's local SQNR per layer and the activations' outlier ratios
    (:func:`~quantdbg.sensitivity.evidence.collect_evidence` with ``calibrators_only``): no weight
    evidence, no mode measurement, no output-space ranking, no task-metric evaluation.

    What :func:`~quantdbg.sensitivity.suggest_calibrators` reads, at the cost of one short pass of the
    calibrator comparison over ``config.evidence_batches`` batches. Through a
    :class:`~quantdbg.sensitivity.journaled.JournaledEvaluator`, it is kept in the evaluator's journal
    under its own key (the Q/DQ model and ``evidence_batches``).
    """
    def collect() -> EvidenceReport:
        found = collect_evidence(evaluator, config, calibrators_only=True)
        return EvidenceReport(tuple(LayerEvidenceEntry(layer, quantized_inputs(evaluator.qmodel, layer),
                                                       found[layer]) for layer in evaluator.layers))

    if not isinstance(evaluator, JournaledEvaluator):
        return collect()
    key = f"evidence:{model_key(evaluator.qmodel.model)}:{digest(str(config.evidence_batches))}"
    return evaluator.journal.stored(key, collect, EvidenceReport.to_dict, EvidenceReport.from_dict)


def _wants_output_space(config: SensitivityConfig) -> bool:
    return config.output_samples > 0 and config.mode in OUTPUT_SPACE_MODES


def _finished(evaluator: VariantEvaluator, config: SensitivityConfig, journal: Journal,
              report: SensitivityReport) -> SensitivityReport:
    """A report finished earlier, with the evidence and the output-space ranking added when asked for
    and missing (neither is part of the fingerprint)."""
    missing_evidence = config.evidence and any(layer.evidence is None for layer in report.layers)
    missing_output = _wants_output_space(config) and report.output_space is None
    if not (missing_evidence or missing_output):
        return report
    if missing_evidence:
        found = collect_evidence(evaluator, config)
        layers = tuple(replace(layer, evidence=found[layer.node]) for layer in report.layers)
        report = replace(report, layers=layers)
    if missing_output:
        report = replace(report, output_space=measure_output_space(evaluator, config.output_samples,
                                                                   config.progress, config.executor))
    journal.record(_REPORT, report.to_dict())
    return report


__all__ = ["analyze_evidence", "analyze_sensitivity", "analyze_variants", "finished_report"]
