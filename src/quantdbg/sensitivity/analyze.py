"""Per-layer sensitivity analysis of a Q/DQ model against its FP32 original.

:func:`analyze_sensitivity` builds a :class:`~quantdbg.sensitivity.evaluator.VariantEvaluator`,
runs the mode (:mod:`quantdbg.sensitivity.modes`), adds the evidence and, for the modes that rank
by a layer's own error, the output-space ranking (:mod:`quantdbg.sensitivity.output_space`), and
ranks the layers into a :class:`~quantdbg.sensitivity.report.SensitivityReport`. With
``results_path`` the sweep resumes from where an interrupted run stopped
(:mod:`quantdbg.sensitivity.resume`).
"""
from __future__ import annotations

import os
import time
from dataclasses import replace

from quantdbg.backends import RunnerFactory
from quantdbg.data import DataSource
from quantdbg.evaluation import MetricName, TaskMetric
from quantdbg.model import ModelSource
from quantdbg.qdq import QuantizedModel
from quantdbg.sensitivity.config import OUTPUT_SPACE_MODES, SensitivityConfig
from quantdbg.sensitivity.evaluator import VariantEvaluator, default_runner_factory
from quantdbg.sensitivity.evidence import collect_evidence
from quantdbg.sensitivity.modes import measure
from quantdbg.sensitivity.output_space import measure_output_space
from quantdbg.sensitivity.report import SensitivityReport
from quantdbg.sensitivity.resume import ResultsFile

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
        config: Mode, parallel jobs, evidence, progress bars and the resumable results file.
        metric: What isolated / leave-one-out variants are scored by: an output-metric name or
            a :class:`~quantdbg.evaluation.TaskMetric` (e.g. a command).
        runner_factory: Makes the runners (default: ONNX Runtime, CPU; with ``jobs > 1`` or an
            executor of several workers each worker gets an equal share of this machine's cores).

    Returns:
        The report, most sensitive layer first.

    Raises:
        ConfigError: ``config.results_path`` belongs to another analysis.
        FormatError: ``config.results_path`` exists but is not a progress file or report.
        ModelError: The models do not match each other or their records.
        DataError: The data does not match the model.
    """
    start = time.perf_counter()
    parallel = config.executor.workers() if config.executor is not None else config.jobs
    if runner_factory is None and parallel > 1:
        runner_factory = default_runner_factory(max(1, (os.cpu_count() or 1) // parallel))
    with VariantEvaluator(fp_model, qmodel, data, metric, runner_factory) as evaluator:
        fingerprint = evaluator.fingerprint(config.mode) if config.results_path is not None else ""
        state = ResultsFile.open(config.results_path, fingerprint, config.mode)
        if state.report is not None:
            return _finished(evaluator, config, state.report)
        found = measure(evaluator, config, state)
        if config.evidence:
            found.evidence = collect_evidence(evaluator, config)
        if _wants_output_space(config):
            found.output_space = measure_output_space(evaluator, config.output_samples, config.progress,
                                                      config.executor)
        report = found.report(evaluator, config.mode, time.perf_counter() - start, fingerprint)
    if config.results_path is not None:
        report.write(config.results_path)
    return report


def _wants_output_space(config: SensitivityConfig) -> bool:
    return config.output_samples > 0 and config.mode in OUTPUT_SPACE_MODES


def _finished(evaluator: VariantEvaluator, config: SensitivityConfig,
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
    report.write(config.results_path)  # type: ignore[arg-type]
    return report


__all__ = ["analyze_sensitivity"]
