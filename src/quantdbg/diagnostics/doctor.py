"""``quantdbg doctor``: run the checks behind the classic PTQ questions and rank the findings.

The questions: which layers are sensitive; are weights being zeroed by a bad range; was the wrong
calibrator used for a tensor; is the calibration set big enough; does one tensor mix value ranges
that a single scale cannot hold; which Q/DQ placements will TensorRT fail to fuse; which weights
did the model hold outside plain initializers (Constant nodes, Transpose/Cast chains). Each has its own
check in :mod:`quantdbg.diagnostics.checks`; :func:`diagnose` quantizes the model once, runs them
and returns a :class:`DoctorReport` whose findings are ordered most serious first, each with its
evidence.
"""
from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from quantdbg import _display, _json
from quantdbg.calibration import CalibratorComparison
from quantdbg.data import DataSource, as_model_data, samples_in
from quantdbg.diagnostics.checks.base import CheckContext
from quantdbg.diagnostics.checks.calibration_size import ScaleStability
from quantdbg.diagnostics.checks.mixed_ranges import MixedRange
from quantdbg.diagnostics.checks.registry import CHECK_REGISTRY
from quantdbg.diagnostics.checks.sensitive_layers import Confirmation
from quantdbg.diagnostics.checks.weight_zeroing import WeightZeroing
from quantdbg.diagnostics.doctor_config import CHECKS, CheckName, DoctorConfig
from quantdbg.diagnostics.findings import Finding, Severity, reaches, severity_counts
from quantdbg.diagnostics.linter import LintReport
from quantdbg.errors import QuantDbgError
from quantdbg.evaluation import TaskMetric
from quantdbg.model.load import ModelSource, as_loaded
from quantdbg.model.weights import FoldedWeight
from quantdbg.qdq import quantize
from quantdbg.sensitivity import SensitivityReport

logger = logging.getLogger(__name__)

RunStatus = Literal["fired", "clear", "skipped", "failed"]
"""How a check went: findings, none, not requested, or it could not run."""


@dataclass(frozen=True)
class CheckRun(_json.Serializable):
    """How one check went.

    Attributes:
        check: The check.
        status: ``"fired"`` (findings), ``"clear"``, ``"skipped"`` (not requested) or ``"failed"``.
        detail: Why it was skipped or failed ("" otherwise).
        seconds: Wall time.
    """

    check: CheckName
    status: RunStatus
    detail: str = ""
    seconds: float = 0.0


def _finite(value: float) -> float:
    return value if math.isfinite(value) else (1e300 if value > 0 else -1e300)


def sort_findings(findings: Iterable[Finding]) -> tuple[Finding, ...]:
    """Most serious first: by severity, then score (descending), then check order, then title."""
    return tuple(sorted(findings, key=lambda f: (-f.severity.rank, -_finite(f.score),
                                                  CHECKS.index(f.check), f.title)))  # type: ignore[arg-type]


# A sensitivity report is a document of its own: nested, it keeps its own form and format tag.


@_json.document("quantdbg.doctor", 1)
@dataclass(frozen=True, repr=False)
class DoctorReport(_display.Displayable, _json.Serializable):
    """Everything the doctor found, most serious finding first, with the measurements behind it.

    Attributes:
        model: What was examined (a path or the graph name).
        n_calib_samples: Calibration samples.
        n_eval_samples: Samples the sensitivity checks ran on.
        findings: Every finding, most serious first.
        runs: One entry per check, in check order.
        config: The configuration used.
        metric: What the isolated confirmation scored besides output SQNR.
        sensitivity: The cheap (local) ranking with its evidence.
        confirmation: The top of that ranking measured in isolation.
        weights: Zeroed-weight shares per quantized weight.
        calibrators: Every calibrator's clip and error per activation tensor.
        stability: Bootstrap scale spread per activation tensor.
        mixed_ranges: Per-channel zeroing under one scale, per examined tensor.
        lint: The TensorRT Q/DQ lint.
        folded_weights: Weights the model held outside plain initializers, and how they were handled.
    """

    model: str
    n_calib_samples: int
    n_eval_samples: int
    findings: tuple[Finding, ...]
    runs: tuple[CheckRun, ...]
    config: DoctorConfig = field(default_factory=DoctorConfig)
    metric: str = "sqnr"
    sensitivity: SensitivityReport | None = None
    confirmation: Confirmation | None = None
    weights: tuple[WeightZeroing, ...] = ()
    calibrators: tuple[CalibratorComparison, ...] = ()
    stability: tuple[ScaleStability, ...] = ()
    mixed_ranges: tuple[MixedRange, ...] = ()
    lint: LintReport | None = None
    folded_weights: tuple[FoldedWeight, ...] = ()

    def counts(self) -> dict[str, int]:
        """Findings per severity (every severity present, possibly 0)."""
        return severity_counts(self.findings)

    def fails(self, fail_on: str | Severity) -> bool:
        """Whether a finding reaches the ``--fail-on`` threshold (never for ``"never"``)."""
        return reaches(self.findings, fail_on)

    def __json_extra__(self) -> dict[str, Any]:
        return {"counts": self.counts()}

    def to_text(self, max_rows: int = 8) -> str:
        """The findings as plain text, most serious first (what ``quantdbg doctor`` prints)."""
        return format_text(self, max_rows)


# --------------------------------------------------------------------------------------------
# Running the checks
# --------------------------------------------------------------------------------------------

def diagnose(model: ModelSource, data: DataSource, eval_data: DataSource | None = None,
             config: DoctorConfig | None = None, *, metric: TaskMetric | str = "sqnr",
             progress: bool = False) -> DoctorReport:
    """Quantizes ``model`` and runs the doctor's checks on it.

    Args:
        model: The FP32 model (path or ModelProto; never modified).
        data: Calibration data (``.npz`` path, arrays, or feeds).
        eval_data: Data for the sensitivity checks (default: the calibration data).
        config: What to run and the thresholds (default :class:`DoctorConfig`).
        metric: Task metric scored for the isolated confirmations besides output SQNR (an
            output-metric name or a :class:`~quantdbg.evaluation.TaskMetric`).
        progress: Show progress bars.

    Returns:
        The report, findings most serious first.

    Raises:
        ModelError: The model cannot be loaded or quantized.
        DataError: The data does not match the model.
        ConfigError: A setting is invalid.
    """
    config = config or DoctorConfig()
    context = _prepare(model, data, eval_data, config, metric, progress)
    findings: list[Finding] = []
    runs = []
    measured: dict[str, tuple[Any, ...]] = {}
    for name, check in CHECK_REGISTRY.items():
        if name not in config.checks:
            runs.append(CheckRun(name, "skipped", "not requested"))
            continue
        start = time.perf_counter()
        try:
            outcome = check.run(context)
        except QuantDbgError as err:  # a check that cannot run must not hide the others' findings
            logger.warning("doctor check %s failed: %s", name, err)
            runs.append(CheckRun(name, "failed", str(err), round(time.perf_counter() - start, 3)))
            continue
        findings.extend(outcome.findings)
        measured[name] = outcome.data
        runs.append(CheckRun(name, "fired" if outcome.findings else "clear", "",
                             round(time.perf_counter() - start, 3)))
    return _report(model, context, sort_findings(findings), tuple(runs), measured)


def _prepare(model: ModelSource, data: DataSource, eval_data: DataSource | None, config: DoctorConfig,
             metric: TaskMetric | str, progress: bool) -> CheckContext:
    """The model quantized once (the checks' common ground) and the data batched for the checks."""
    loaded = as_loaded(model)
    calib = as_model_data(data, loaded.proto, config.batch_size)
    evals = calib if eval_data is None else as_model_data(eval_data, loaded.proto, config.batch_size)
    # Ready batches: quantize() calibrates on exactly these (it re-batches only when given a size).
    qmodel = quantize(loaded, calib, config.calib, config.quant, progress=progress)
    return CheckContext(loaded.proto, calib, evals, qmodel, config, metric, progress,
                        folded_weights=loaded.folded)


def _report(model: ModelSource, ctx: CheckContext, findings: tuple[Finding, ...], runs: tuple[CheckRun, ...],
            measured: dict[str, tuple[Any, ...]]) -> DoctorReport:
    first = lambda check: measured[check][0] if measured.get(check) else None  # noqa: E731
    metric = ctx.metric if isinstance(ctx.metric, str) else ctx.metric.describe()
    label = str(model) if isinstance(model, (str, os.PathLike)) else (ctx.fp_model.graph.name or "model")
    n_eval = sum(samples_in(feed) for feed in ctx.evals)
    return DoctorReport(
        label, ctx.calibration.n_samples, n_eval, findings, runs, ctx.config, metric, ctx.sensitivity,
        first("sensitive_layers"), measured.get("weight_zeroing", ()),
        measured.get("calibrator_disagreement", ()), measured.get("calibration_size", ()),
        measured.get("mixed_ranges", ()), first("qdq_fusion"), measured.get("folded_weights", ()))


# --------------------------------------------------------------------------------------------
# Text
# --------------------------------------------------------------------------------------------

def format_text(report: DoctorReport, max_rows: int = 8) -> str:
    """Renders the findings as plain text, most serious first.

    Args:
        report: The doctor's report.
        max_rows: Evidence rows shown per finding.

    Returns:
        The text, ending with a newline.
    """
    counts = report.counts()
    lines = [f"quantdbg doctor: {report.model} ({report.n_calib_samples} calibration samples, "
             f"{report.n_eval_samples} evaluation samples)",
             f"{sum(r.status != 'skipped' for r in report.runs)} checks, {len(report.findings)} finding(s)"
             + "".join(f", {n} {s}" for s, n in counts.items() if n), ""]
    for i, finding in enumerate(report.findings, 1):
        lines.append(f"{i}. [{finding.severity.value.upper()}] {finding.check}: {finding.title}")
        lines += finding.evidence.text_lines(max_rows, "     ")
        lines += [f"     fix: {finding.fix}", ""]
    if not report.findings:
        lines += ["No problems found.", ""]
    for run in report.runs:
        if run.status == "failed":
            lines.append(f"check {run.check} could not run: {run.detail}")
    return "\n".join(lines).rstrip() + "\n"
