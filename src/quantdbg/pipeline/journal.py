"""The flow's resumable record: finished passes and every task-metric evaluation, kept in one file.

A pass over the data (a calibration, a sensitivity analysis, a per-channel measurement) and an
evaluation are each stored under a key naming exactly what was computed (a hash of the model
bytes, and of the quantized layers of a variant). The file (a ``quantdbg.auto-progress/1``
document) is rewritten atomically after each one, so a run stopped at any point resumes without
computing anything twice; it carries the fingerprint of the model, the data, the metric, the
target and the settings, and a file of another run is refused.

:class:`JournaledEvaluator` and :class:`JournaledMetric` route every evaluation through the
journal: in-session metrics through the evaluator's ``run``/``run_model``/``reference_value``,
model-file metrics (commands) through ``evaluate_model``, whoever calls them (the repairs, the
fallback search, its verification); :class:`JournaledScores` keys the task-metric scores a
sensitivity analysis makes by the outputs scored.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import onnx

from quantdbg import _json
from quantdbg._fingerprint import compose, differences, feeds_digest
from quantdbg._json import Serializable
from quantdbg.backends import RunnerFactory
from quantdbg.calibration import CalibrationResult
from quantdbg.data import DataSource
from quantdbg.errors import ConfigError, FormatError
from quantdbg.evaluation import Comparison, OutputMetric, TaskMetric
from quantdbg.model import ModelSource, model_bytes
from quantdbg.pipeline.config import PHASES, Phase
from quantdbg.pipeline.records import ChannelRange
from quantdbg.qdq import QuantizedModel
from quantdbg.sensitivity import SensitivityReport, VariantEvaluator, VariantResult

logger = logging.getLogger(__name__)

T = TypeVar("T")


def digest(*parts: bytes | str) -> str:
    """A short SHA-256 hex digest of ``parts`` (strings UTF-8 encoded)."""
    hasher = hashlib.sha256()
    for part in parts:
        hasher.update(part.encode() if isinstance(part, str) else part)
    return hasher.hexdigest()[:32]


def model_key(model: onnx.ModelProto) -> str:
    """The digest of a model's bytes (what an evaluation of it is stored under)."""
    return digest(*model_bytes(model))


@dataclass(frozen=True)
class EvaluationRecord(Serializable):
    """One task-metric evaluation.

    Attributes:
        phase: The phase that made it.
        value: The task metric.
        comparison: Outputs against FP32 (in-session metrics; None for model-file metrics).
    """

    phase: Phase
    value: float
    comparison: Comparison | None = None


@_json.document("quantdbg.auto-progress", 1)
@dataclass(frozen=True)
class AutoProgress(Serializable):
    """What a run of the flow has finished so far (the resume file).

    Attributes:
        fingerprint: Hash of the model, the data, the metric, the target and the settings.
        calibrations: Pass key -> calibration (statistics with histograms).
        analyses: Pass key -> sensitivity report.
        channels: Pass key -> per-channel ranges measured for SmoothQuant.
        evaluations: Evaluation key -> its record.
    """

    fingerprint: str
    calibrations: Mapping[str, CalibrationResult] = field(default_factory=dict)
    analyses: Mapping[str, SensitivityReport] = field(default_factory=dict)
    channels: Mapping[str, tuple[ChannelRange, ...]] = field(default_factory=dict)
    evaluations: Mapping[str, EvaluationRecord] = field(default_factory=dict)


class Journal:
    """The finished passes and evaluations of one run, written after each new one.

    Args:
        path: The resume file (None: kept in memory only).
        fingerprint: The run's fingerprint (:func:`fingerprint`).
    """

    def __init__(self, path: Path | None, fingerprint: str) -> None:
        self.path = path
        self.fingerprint = fingerprint
        self.calibrations: dict[str, CalibrationResult] = {}
        self.analyses: dict[str, SensitivityReport] = {}
        self.channels: dict[str, tuple[ChannelRange, ...]] = {}
        self.evaluations: dict[str, EvaluationRecord] = {}
        self.phase: Phase = "reference"
        self._used: dict[str, Phase] = {}

    @classmethod
    def open(cls, path: str | os.PathLike | None, fingerprint: str) -> Journal:
        """The journal of a run, with what an earlier run of the same job left in ``path``.

        Raises:
            ConfigError: The file belongs to another run.
            FormatError: The file is unreadable or not a progress file.
        """
        journal = cls(None if path is None else Path(path), fingerprint)
        if journal.path is None or not journal.path.exists():
            return journal
        data = _json.read_json(journal.path)
        if not isinstance(data, dict):
            raise FormatError(f"Resume file {str(journal.path)!r} is not a progress file (it holds "
                              f"{type(data).__name__}, not an object); delete it to start afresh.")
        if data.get("fingerprint") != fingerprint:
            raise ConfigError(f"Resume file {str(journal.path)!r} belongs to another run: "
                              f"{differences(data.get('fingerprint'), fingerprint)}; delete it to start "
                              "afresh, or choose another resume file.")
        try:
            found = AutoProgress.from_dict(data, repr(str(journal.path)))
        except FormatError as err:
            raise FormatError(f"Cannot resume: {err} Or delete the file.") from err
        journal.calibrations.update(found.calibrations)
        journal.analyses.update(found.analyses)
        journal.channels.update(found.channels)
        journal.evaluations.update(found.evaluations)
        logger.info("resuming: %d pass(es) and %d evaluation(s) already done", len(found.calibrations)
                    + len(found.analyses) + len(found.channels), len(found.evaluations))
        return journal

    def _save(self) -> None:
        if self.path is not None:
            AutoProgress(self.fingerprint, self.calibrations, self.analyses, self.channels,
                         self.evaluations).write(self.path)

    def _stored(self, table: dict[str, T], key: str, compute: Callable[[], T]) -> T:
        if key not in table:
            table[key] = compute()
            self._save()
        return table[key]

    def calibration(self, key: str, compute: Callable[[], CalibrationResult]) -> CalibrationResult:
        """The calibration stored under ``key``, computed (and stored) when missing."""
        return self._stored(self.calibrations, key, compute)

    def analysis(self, key: str, compute: Callable[[], SensitivityReport]) -> SensitivityReport:
        """The sensitivity report stored under ``key``, computed (and stored) when missing."""
        return self._stored(self.analyses, key, compute)

    def channel_ranges(self, key: str,
                       compute: Callable[[], tuple[ChannelRange, ...]]) -> tuple[ChannelRange, ...]:
        """The per-channel ranges stored under ``key``, measured (and stored) when missing."""
        return self._stored(self.channels, key, compute)

    def evaluation(self, key: str, compute: Callable[[], VariantResult]) -> VariantResult:
        """The evaluation stored under ``key``; made (in the current phase) and stored when missing."""
        record = self.evaluations.get(key)
        if record is None:
            result = compute()
            record = EvaluationRecord(self.phase, result.value, result.comparison)
            self.evaluations[key] = record
            self._save()
        self._used.setdefault(key, record.phase)
        return VariantResult(record.comparison, record.value)

    def counts(self) -> dict[Phase, int]:
        """Phase -> evaluations this run used (each once; those restored from the file included)."""
        found = Counter(self._used.values())
        return {phase: found[phase] for phase in PHASES if found[phase]}


class _Journaled(TaskMetric):
    """A task metric whose evaluations go through a journal: it names, directs, describes and
    identifies itself as the metric it wraps.

    Args:
        inner: The metric.
        journal: Where evaluations are kept.
    """

    identity_attrs = ("inner",)

    def __init__(self, inner: TaskMetric, journal: Journal) -> None:
        self.inner = inner
        self.journal = journal
        self.name = inner.name
        self.higher_is_better = inner.higher_is_better

    def describe(self) -> str:
        """The inner metric's description."""
        return self.inner.describe()


class JournaledMetric(_Journaled):
    """A model-file task metric (e.g. a command) whose evaluations go through a journal, keyed by the
    model's bytes.

    Args:
        inner: The metric (``needs_model``).
        journal: Where evaluations are kept.
    """

    needs_model = True

    def from_model(self, path: Path) -> float:
        """The inner metric of the model at ``path`` (not journaled: :meth:`evaluate_model` is)."""
        return self.inner.from_model(path)

    def evaluate_model(self, model: onnx.ModelProto) -> float:
        """The inner metric of ``model``, from the journal when this model was evaluated before."""
        compute = lambda: VariantResult(None, self.inner.evaluate_model(model))  # noqa: E731
        return self.journal.evaluation(f"model:{model_key(model)}", compute).value


def _outputs_digest(outputs: Mapping[str, np.ndarray]) -> str:
    hasher = hashlib.sha256()
    _feeds_digest(hasher, [outputs])
    return hasher.hexdigest()[:32]


class JournaledScores(_Journaled):
    """An in-session task metric whose scores go through a journal, keyed by the outputs scored.

    For the evaluations a sensitivity analysis makes with the task metric (its variants are not
    named to the flow): a resumed run scores no outputs twice.

    Args:
        inner: The metric (computed from outputs).
        journal: Where evaluations are kept.
    """

    def from_outputs(self, outputs: Mapping[str, np.ndarray], reference: Mapping[str, np.ndarray]) -> float:
        """The inner metric of ``outputs``, from the journal when these outputs were scored before."""
        key = f"outputs:{_outputs_digest(outputs)}:{_outputs_digest(reference)}"
        compute = lambda: VariantResult(None, self.inner.from_outputs(outputs, reference))  # noqa: E731
        return self.journal.evaluation(key, compute).value


def analysis_metric(metric: TaskMetric, journal: Journal) -> TaskMetric:
    """The task metric a sensitivity analysis of the flow gets: journaled when it runs the user's code.

    A model-file metric is already a :class:`JournaledMetric`; an output-difference metric pooled
    over every output is computed by the evaluator itself and stays as it is (its value must not
    change); any other in-session metric becomes a :class:`JournaledScores`.
    """
    if metric.needs_model or (isinstance(metric, OutputMetric) and metric.output is None):
        return metric
    return JournaledScores(metric, journal)


class JournaledEvaluator(VariantEvaluator):
    """A :class:`~quantdbg.sensitivity.VariantEvaluator` whose evaluations go through a journal.

    In-session evaluations are keyed by the Q/DQ model and the quantized layers (``run``) or by the
    model's bytes (``run_model``); a model-file metric should be a :class:`JournaledMetric`, which
    keys its own evaluations.

    Args:
        fp_model: The FP32 model.
        qmodel: The Q/DQ model and its records.
        data: Evaluation data.
        metric: The task metric.
        runner_factory: Makes the runners.
        journal: Where evaluations are kept.
    """

    def __init__(self, fp_model: ModelSource, qmodel: QuantizedModel, data: DataSource, metric: TaskMetric,
                 runner_factory: RunnerFactory, journal: Journal) -> None:
        super().__init__(fp_model, qmodel, data, metric, runner_factory)
        self.journal = journal
        self._qkey = ""

    def run(self, quantized: Collection[str]) -> VariantResult:
        """:meth:`VariantEvaluator.run`, from the journal when this variant was evaluated before."""
        if self.metric.needs_model:
            return super().run(quantized)
        if not self._qkey:
            self._qkey = model_key(self.qmodel.model)
        layers = "\n".join(sorted(quantized))
        key = f"variant:{self._qkey}:{digest(layers)}"
        return self.journal.evaluation(key, lambda: super(JournaledEvaluator, self).run(quantized))

    def run_model(self, model: onnx.ModelProto) -> VariantResult:
        """:meth:`VariantEvaluator.run_model`, from the journal when this model was evaluated before."""
        if self.metric.needs_model:
            return super().run_model(model)
        return self.journal.evaluation(f"model:{model_key(model)}",
                                       lambda: super(JournaledEvaluator, self).run_model(model))

    def reference_value(self) -> float:
        """:meth:`VariantEvaluator.reference_value`, from the journal when evaluated before."""
        if self.metric.needs_model:
            return super().reference_value()
        key = f"reference:{model_key(self.fp_model)}"
        compute = lambda: VariantResult(None, super(JournaledEvaluator, self).reference_value())  # noqa: E731
        return self.journal.evaluation(key, compute).value


def _feeds_digest(hasher: Any, feeds: Iterable[Mapping[str, np.ndarray]]) -> None:
    for feed in feeds:
        for name in sorted(feed):
            hasher.update(name.encode())
            hasher.update(np.ascontiguousarray(feed[name]).tobytes())


def fingerprint(model: onnx.ModelProto, calib: Iterable[Mapping[str, np.ndarray]],
                evals: Iterable[Mapping[str, np.ndarray]], metric: TaskMetric, target: Serializable,
                settings: Serializable) -> str:
    """Hash of everything that decides a run's result (the resume file must match it).

    Args:
        model: The FP32 model.
        calib: Calibration feeds.
        evals: Evaluation feeds.
        metric: The task metric (its full identity: command and folder, labels, parameters).
        target: The target.
        settings: The settings that decide the result (``AutoConfig.settings()``).

    Returns:
        A digest per ingredient (so a mismatch can say which differs).
    """
    return compose({"model": model_key(model), "calibration data": feeds_digest(calib),
                    "evaluation data": feeds_digest(evals), "metric": digest(metric.identity()),
                    "target": digest(json.dumps(target.to_dict(), sort_keys=True)),
                    "settings": digest(json.dumps(settings.to_dict(), sort_keys=True))})


__all__ = ["AutoProgress", "EvaluationRecord", "Journal", "JournaledEvaluator", "JournaledMetric",
           "JournaledScores", "analysis_metric", "digest", "fingerprint", "model_key"]
