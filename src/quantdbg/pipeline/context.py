"""What every phase of the flow shares: the data, the task metric, the journal, and the models on the way.

A :class:`Stage` is one INT8 model the flow holds (the default one, then each repaired one); the
:class:`AutoContext` builds stages and runs the passes over the data they need, each through the
journal, so a resumed run repeats none of them.
"""
from __future__ import annotations

import itertools
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from quantdbg import _json
from quantdbg._fingerprint import digest
from quantdbg._journal import Journal
from quantdbg.calibration import CalibrationResult, CollectConfig, calibrate, collect_stats
from quantdbg.calibration.bias_correction import correct_biases
from quantdbg.calibration.equalization import equalize
from quantdbg.calibration.smoothing.measure import collect_channel_absmax
from quantdbg.config import CalibConfig
from quantdbg.data import CalibrationData
from quantdbg.evaluation import OutputMetric, TaskMetric
from quantdbg.evaluation.task import concat_batches
from quantdbg.model import LoadedModel
from quantdbg.pipeline.config import AutoConfig, Phase
from quantdbg.pipeline.records import ChannelRange, SmoothingStep
from quantdbg.placement import QdqPlan, plan_qdq
from quantdbg.qdq import QuantizedModel, insert_qdq
from quantdbg.sensitivity import SensitivityReport
from quantdbg.sensitivity.analyze import analyze_evidence, analyze_variants
from quantdbg.sensitivity.journaled import JournaledEvaluator, model_key
from quantdbg.sensitivity.report import EvidenceReport
from quantdbg.variants.evaluator import default_runner_factory

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Stage:
    """One INT8 model on the flow's way.

    Attributes:
        fp: Its FP32 model (the smoothed or equalized one once SmoothQuant or equalization was kept).
        plan: Its Q/DQ plan.
        calibration: Its ranges and the statistics behind them (histograms for every tensor); its
            ``config`` is the calibrator choice in use.
        qmodel: The Q/DQ model.
        smoothing: What SmoothQuant did to reach ``fp`` (None when not smoothed).
    """

    fp: LoadedModel
    plan: QdqPlan
    calibration: CalibrationResult
    qmodel: QuantizedModel
    smoothing: SmoothingStep | None = None

    @property
    def calib_config(self) -> CalibConfig:
        """The calibrator choice of this stage."""
        return self.calibration.config


class AutoContext:
    """The flow's data, metric, settings and journal, and the passes over the data built on them.

    Args:
        calib: Calibration feeds.
        evals: Evaluation feeds.
        metric: The task metric (journaled when it runs on model files).
        config: The flow's settings.
        journal: Where passes and evaluations are kept.
    """

    def __init__(self, calib: CalibrationData, evals: CalibrationData, metric: TaskMetric, config: AutoConfig,
                 journal: Journal) -> None:
        self.calib = calib
        self.evals = evals
        self.metric = metric
        self.config = config
        self.journal = journal
        self.runner_factory = default_runner_factory(config.threads)
        self.last_report: SensitivityReport | None = None
        self._head_references: dict[str, dict[str, np.ndarray]] = {}  # FP32 outputs on the first batches

    def stage(self, fp: LoadedModel, calib_config: CalibConfig,
              smoothing: SmoothingStep | None = None) -> Stage:
        """Plans, calibrates (a stored pass) and quantizes ``fp`` with ``calib_config``; with
        ``calib_config.equalize`` the stage's FP32 model is the equalized one (the model quantized)."""
        if calib_config.equalize:
            fp = equalize(fp).model  # idempotent: an equalized model comes back as it is
        plan = plan_qdq(fp, self.config.quant)
        calibration = self.calibration(fp, calib_config, plan)
        qmodel = insert_qdq(fp, calibration, self.config.quant, plan=plan)
        return Stage(fp, plan, calibration, qmodel, smoothing)

    def recalibrated(self, stage: Stage, calib_config: CalibConfig, calibration: CalibrationResult) -> Stage:
        """``stage`` with other ranges of the same statistics (no pass over the data)."""
        qmodel = insert_qdq(stage.fp, calibration, self.config.quant, plan=stage.plan)
        return replace(stage, calibration=calibration, qmodel=qmodel)

    def calibration(self, fp: LoadedModel, calib_config: CalibConfig, plan: QdqPlan) -> CalibrationResult:
        """The calibration of ``fp`` with a histogram for every tensor (so any calibrator can be
        re-derived later); one pass, plus one for the histograms the chosen calibrators did not need."""
        return self._stored_calibration(_calibration_key(fp, calib_config),
                                        lambda: self._calibrate(fp, calib_config, plan))

    def _stored_calibration(self, key: str, make: Callable[[], CalibrationResult]) -> CalibrationResult:
        return self.journal.stored(key, make, _json.encode, CalibrationResult.from_dict)

    def bias_corrected(self, stage: Stage) -> Stage:
        """``stage`` with its biases corrected: one pass measures the corrections (stored as the
        calibration :meth:`calibration` would make with ``bias_correction``); the ranges stay."""
        config = replace(stage.calib_config, bias_correction=True)

        def measure() -> CalibrationResult:
            found = correct_biases(stage.fp, self.calib, stage.plan, max_batches=config.max_batches,
                                   progress=self.config.progress)
            return replace(stage.calibration, config=config, bias_correction=found)

        calibration = self._stored_calibration(_calibration_key(stage.fp, config), measure)
        return self.recalibrated(stage, config, calibration)

    def _calibrate(self, fp: LoadedModel, calib_config: CalibConfig, plan: QdqPlan) -> CalibrationResult:
        found = calibrate(fp, self.calib, calib_config, plan, progress=self.config.progress)
        missing = [name for name, stats in found.stats.items() if stats.hist is None]
        if not missing:
            return found
        collect = CollectConfig(histogram=True, num_bins=calib_config.num_bins,
                                max_batches=calib_config.max_batches)
        extra = collect_stats(fp, self.calib, missing, collect, progress=self.config.progress)
        return replace(found, stats={**found.stats, **extra})

    def analysis(self, stage: Stage) -> SensitivityReport:
        """The sensitivity of ``stage`` with its evidence (a stored pass), in phase ``rank``."""
        sensitivity = replace(self.config.fallback.sensitivity, evidence=True, progress=self.config.progress)
        with self.in_phase("rank"), self.evaluator(stage) as evaluator:
            self.last_report = analyze_variants(evaluator, sensitivity)
        return self.last_report

    def evidence(self, stage: Stage) -> EvidenceReport:
        """Every layer's evidence of ``stage`` alone (a stored pass; no ranking, no task-metric evaluation):
        what the calibrator choice reads; the ranking is left to the fallback's :meth:`analysis`."""
        sensitivity = replace(self.config.fallback.sensitivity, progress=self.config.progress)
        with self.evaluator(stage) as evaluator:
            return analyze_evidence(evaluator, sensitivity)

    def output_sqnr(self, stage: Stage, samples: int) -> float:
        """The SQNR (dB) of ``stage``'s Q/DQ model's outputs against its FP32 model's, pooled over every
        output, on the fewest first batches of the evaluation data holding ``samples`` samples (two
        short passes, no task-metric evaluation; the value is kept in the journal)."""
        fp_key = model_key(stage.fp.proto)

        def measure() -> float:
            with self.evaluator(stage) as evaluator:
                batches = evaluator.batches_holding(samples)
                head = f"{fp_key}:{batches}"
                if head not in self._head_references:  # one FP32 pass per model, however many gates
                    self._head_references[head] = concat_batches(evaluator.head_reference(batches))
            with self.runner_factory(stage.qmodel.model) as runner:
                outputs = [runner.infer(feed) for feed in itertools.islice(self.evals, batches)]
            return OutputMetric("sqnr").from_outputs(concat_batches(outputs), self._head_references[head])

        key = f"output_sqnr:{model_key(stage.qmodel.model)}:{fp_key}:{samples}"
        return self.journal.stored(key, measure, _json.encode,
                                   lambda data, where: _json.decode(float, data, where))  # type: ignore[no-any-return]

    def channel_absmax(self, fp: LoadedModel, tensors: tuple[str, ...]) -> tuple[ChannelRange, ...]:
        """Per-channel max|x| of ``tensors`` on the calibration data (a stored pass)."""
        def measure() -> tuple[ChannelRange, ...]:
            found = collect_channel_absmax(fp, self.calib, tensors, progress=self.config.progress)
            return tuple(ChannelRange(name, np.asarray(found.absmax[name])) for name in tensors)

        def decode(data: Any, where: str) -> tuple[ChannelRange, ...]:
            return _json.decode(tuple[ChannelRange, ...], data, where)  # type: ignore[no-any-return]

        key = f"channels:{model_key(fp.proto)}:{digest(*tensors)}"
        return self.journal.stored(key, measure, _json.encode, decode)

    def evaluator(self, stage: Stage) -> JournaledEvaluator:
        """An evaluator of ``stage`` on the evaluation data whose evaluations go through the journal."""
        return JournaledEvaluator(stage.fp, stage.qmodel, self.evals, self.metric, self.runner_factory,
                                  journal=self.journal)

    def in_phase(self, phase: Phase) -> _PhaseScope:
        """A ``with`` block whose evaluations count under ``phase``."""
        return _PhaseScope(self.journal, phase)


def _calibration_key(fp: LoadedModel, calib_config: CalibConfig) -> str:
    setting = json.dumps(calib_config.to_dict(), sort_keys=True)
    return f"calibration:{model_key(fp.proto)}:{digest(setting)}"


class _PhaseScope:
    def __init__(self, journal: Journal, phase: Phase) -> None:
        self.journal = journal
        self.phase = phase
        self.previous = journal.phase

    def __enter__(self) -> None:
        self.previous = self.journal.phase
        self.journal.phase = self.phase
        logger.info("auto: %s", self.phase)

    def __exit__(self, *exc: Any) -> None:
        self.journal.phase = self.previous


__all__ = ["AutoContext", "Stage"]
