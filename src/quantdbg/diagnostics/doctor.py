"""``quantdbg doctor``: run the checks behind the classic PTQ questions and rank the findings.

The questions: which layers are sensitive; are weights being zeroed by a bad range; was the wrong
calibrator used for a tensor; is the calibration set big enough; does one tensor mix value ranges
that a single scale cannot hold; which Q/DQ placements will TensorRT fail to fuse. Each has its own
check in :mod:`quantdbg.doctor_checks`; :func:`diagnose` runs them on one model and returns a
:class:`DoctorReport` whose findings are ordered most serious first, each with its evidence.
"""
from __future__ import annotations

import json
import logging
import math
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from quantdbg import _display
from quantdbg._io import write_json_atomic
from quantdbg.config import CalibConfig, QuantConfig
from quantdbg.data import DEFAULT_BATCH_SIZE
from quantdbg.diagnostics.checks import (
    CHECKS,
    SEVERITIES,
    CalibratorComparison,
    CheckName,
    CheckOutcome,
    Confirmation,
    Finding,
    MixedRange,
    ScaleStability,
    WeightZeroing,
    sort_findings,
)
from quantdbg.errors import ConfigError, QuantDbgError

if TYPE_CHECKING:
    import onnx

    from quantdbg.calibration import CalibrationResult
    from quantdbg.data import CalibrationData, DataSource
    from quantdbg.diagnostics.linter import LintReport
    from quantdbg.evaluation import TaskMetric
    from quantdbg.model import ModelSource
    from quantdbg.placement import QdqPlan
    from quantdbg.qdq import QuantizedModel
    from quantdbg.sensitivity import SensitivityReport

logger = logging.getLogger(__name__)

DOCTOR_FORMAT = "quantdbg.doctor/1"
RunStatus = Literal["fired", "clear", "skipped", "failed"]


@dataclass(frozen=True)
class DoctorConfig:
    """What the doctor runs and the thresholds its checks judge by.

    Attributes:
        calib: How the model is calibrated before it is examined.
        quant: Where Q/DQ pairs go.
        checks: The checks to run, from :data:`quantdbg.doctor_checks.CHECKS`.
        batch_size: Samples per batch for arrays and ``.npz`` data.
        confirm_top: Layers of the cheap (local) ranking confirmed in isolation.
        sensitive_sqnr_db: Isolated output SQNR (dB) below which a layer is sensitive.
        dominant_share: Share of the fully quantized model's output noise that makes one layer
            the culprit even when its SQNR looks fine.
        zeroed_fraction: Share of non-zero weights rounding to 0 above which a weight is named.
        disagreement_ratio: Largest / smallest calibrator clip above which calibrators disagree.
        bootstrap_chunks: Interleaved chunks of calibration samples the bootstrap resamples.
        bootstrap_rounds: Resamples per sample-count level.
        stable_spread: Largest relative half-width of a scale's 10-90 % bootstrap band that still
            counts as stable.
        swamped_fraction: Share of a channel's non-zero values rounding to 0 that swamps it.
        hidden_sqnr_db: Whole-tensor SQNR at or above which swamped channels go unnoticed.
        threads: ONNX Runtime intra-op threads (0: all cores).
        seed: Seed of the bootstrap.

    Raises:
        ConfigError: A value is out of range or a check name is unknown.
    """

    calib: CalibConfig = field(default_factory=CalibConfig)
    quant: QuantConfig = field(default_factory=QuantConfig)
    checks: tuple[CheckName, ...] = CHECKS
    batch_size: int = DEFAULT_BATCH_SIZE
    confirm_top: int = 3
    sensitive_sqnr_db: float = 30.0
    dominant_share: float = 0.5
    zeroed_fraction: float = 0.05
    disagreement_ratio: float = 2.0
    bootstrap_chunks: int = 8
    bootstrap_rounds: int = 16
    stable_spread: float = 0.05
    swamped_fraction: float = 0.5
    hidden_sqnr_db: float = 25.0
    threads: int = 0
    seed: int = 0

    def __post_init__(self) -> None:
        if isinstance(self.checks, str):
            raise ConfigError("checks takes a sequence of check names, not one string.")
        object.__setattr__(self, "checks", tuple(self.checks))
        for name in self.checks:
            if name not in CHECKS:
                from quantdbg.errors import unknown

                raise unknown("doctor check", name, CHECKS, ConfigError)
        for field_name, low in (("batch_size", 1), ("confirm_top", 1), ("bootstrap_chunks", 2),
                          ("bootstrap_rounds", 2), ("threads", 0)):
            if getattr(self, field_name) < low:
                raise ConfigError(f"DoctorConfig.{field_name} must be >= {low}, "
                                  f"got {getattr(self, field_name)}.")
        for field_name in ("zeroed_fraction", "dominant_share", "stable_spread", "swamped_fraction"):
            if not 0.0 < getattr(self, field_name) <= 1.0:
                raise ConfigError(f"DoctorConfig.{field_name} must be in (0, 1], got "
                                  f"{getattr(self, field_name)}.")
        if not self.disagreement_ratio > 1.0:
            raise ConfigError(f"DoctorConfig.disagreement_ratio must be > 1, got {self.disagreement_ratio}.")

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        data = {k: v for k, v in self.__dict__.items() if k not in ("calib", "quant")}
        data["checks"] = list(self.checks)
        data["calib"] = self.calib.to_dict()
        data["quant"] = self.quant.to_dict()
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> DoctorConfig:
        """Inverse of :meth:`to_dict`."""
        values = dict(data)
        values["calib"] = CalibConfig.from_dict(values["calib"])
        values["quant"] = QuantConfig.from_dict(values["quant"])
        values["checks"] = tuple(values["checks"])
        return cls(**values)


@dataclass(frozen=True)
class CheckRun:
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

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return dict(self.__dict__)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CheckRun:
        """Inverse of :meth:`to_dict`."""
        return cls(**data)


@dataclass(frozen=True)
class DoctorReport:
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

    def counts(self) -> dict[str, int]:
        """Findings per severity (every severity present, possibly 0)."""
        return {s: sum(f.severity == s for f in self.findings) for s in SEVERITIES}

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        opt = lambda value: None if value is None else value.to_dict()  # noqa: E731
        return {"format": DOCTOR_FORMAT, "model": self.model, "n_calib_samples": self.n_calib_samples,
                "n_eval_samples": self.n_eval_samples, "counts": self.counts(),
                "findings": [f.to_dict() for f in self.findings], "runs": [r.to_dict() for r in self.runs],
                "config": self.config.to_dict(), "metric": self.metric, "sensitivity": opt(self.sensitivity),
                "confirmation": opt(self.confirmation), "weights": [w.to_dict() for w in self.weights],
                "calibrators": [c.to_dict() for c in self.calibrators],
                "stability": [s.to_dict() for s in self.stability],
                "mixed_ranges": [m.to_dict() for m in self.mixed_ranges], "lint": opt(self.lint)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> DoctorReport:
        """Inverse of :meth:`to_dict`.

        Raises:
            ConfigError: ``data`` is not a doctor report.
        """
        if data.get("format") != DOCTOR_FORMAT:
            raise ConfigError(f"Not a quantdbg doctor report (format {data.get('format')!r}, expected "
                              f"{DOCTOR_FORMAT!r}).")
        from quantdbg.diagnostics.linter import LintReport
        from quantdbg.sensitivity import SensitivityReport

        opt = lambda key, typ: None if data.get(key) is None else typ.from_dict(data[key])  # noqa: E731
        many = lambda key, typ: tuple(typ.from_dict(x) for x in data.get(key, ()))  # noqa: E731
        return cls(data["model"], int(data["n_calib_samples"]), int(data["n_eval_samples"]),
                   many("findings", Finding), many("runs", CheckRun), DoctorConfig.from_dict(data["config"]),
                   data.get("metric", "sqnr"), opt("sensitivity", SensitivityReport),
                   opt("confirmation", Confirmation), many("weights", WeightZeroing),
                   many("calibrators", CalibratorComparison), many("stability", ScaleStability),
                   many("mixed_ranges", MixedRange), opt("lint", LintReport))

    def write(self, path: str | os.PathLike) -> Path:
        """Writes :meth:`to_dict` as JSON atomically."""
        return write_json_atomic(path, self.to_dict())

    @classmethod
    def read(cls, path: str | os.PathLike) -> DoctorReport:
        """Reads a report written by :meth:`write`.

        Raises:
            ConfigError: The file is missing, not JSON, or not a doctor report.
        """
        try:
            return cls.from_dict(json.loads(Path(path).read_text()))
        except (OSError, ValueError) as err:
            raise ConfigError(f"Cannot read doctor report {str(path)!r}: {err}") from err

    def to_text(self, max_rows: int = 8) -> str:
        """The findings as plain text, most serious first (what ``quantdbg doctor`` prints)."""
        return format_text(self, max_rows)

    def _repr_html_(self) -> str:
        return _display.html(self)


# --------------------------------------------------------------------------------------------
# Running the checks
# --------------------------------------------------------------------------------------------

@dataclass
class _Context:
    """What the checks share: the models, data and intermediate results of one diagnosis."""

    fp_model: onnx.ModelProto
    calib: CalibrationData
    evals: CalibrationData
    plan: QdqPlan
    calibration: CalibrationResult
    qmodel: QuantizedModel
    config: DoctorConfig
    metric: TaskMetric | str
    progress: bool
    sensitivity: SensitivityReport | None = None
    n_eval_samples: int = 0
    data: dict[str, tuple[Any, ...]] = field(default_factory=dict)


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
            output-metric name or a :class:`~quantdbg.evaluate.TaskMetric`).
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
    for check in CHECKS:
        if check not in config.checks:
            runs.append(CheckRun(check, "skipped", "not requested"))
            continue
        start = time.perf_counter()
        try:
            outcome = _RUNNERS[check](context)
        except QuantDbgError as err:  # a check that cannot run must not hide the others' findings
            logger.warning("doctor check %s failed: %s", check, err)
            runs.append(CheckRun(check, "failed", str(err), round(time.perf_counter() - start, 3)))
            continue
        findings.extend(outcome.findings)
        context.data[check] = outcome.data
        runs.append(CheckRun(check, "fired" if outcome.findings else "clear", "",
                             round(time.perf_counter() - start, 3)))
    return _report(model, context, sort_findings(findings), tuple(runs))


def _prepare(model: ModelSource, data: DataSource, eval_data: DataSource | None, config: DoctorConfig,
             metric: TaskMetric | str, progress: bool) -> _Context:
    from quantdbg.calibration import calibrate
    from quantdbg.data import as_data
    from quantdbg.model import as_loaded, input_specs
    from quantdbg.placement import plan_qdq
    from quantdbg.qdq import insert_qdq

    loaded = as_loaded(model)
    fp_model = loaded.proto
    inputs = list(input_specs(fp_model))
    calib = as_data(data, config.batch_size, inputs=inputs)
    evals = calib if eval_data is None else as_data(eval_data, config.batch_size, inputs=inputs)
    plan = plan_qdq(fp_model, config.quant)
    calibration = calibrate(loaded, calib, config.calib, plan, progress=progress)
    qmodel = insert_qdq(loaded, calibration, config.quant, plan=plan)
    n_eval = sum(int(np.shape(next(iter(feed.values())))[0]) for feed in evals)
    return _Context(fp_model, calib, evals, plan, calibration, qmodel, config, metric, progress,
                    n_eval_samples=n_eval)


def _report(model: ModelSource, context: _Context, findings: tuple[Finding, ...],
            runs: tuple[CheckRun, ...]) -> DoctorReport:
    data = context.data
    first = lambda check: data[check][0] if data.get(check) else None  # noqa: E731
    metric = context.metric if isinstance(context.metric, str) else context.metric.describe()
    label = str(model) if isinstance(model, (str, os.PathLike)) else (context.fp_model.graph.name or "model")
    return DoctorReport(
        label, context.calibration.n_samples, context.n_eval_samples, findings, runs, context.config, metric,
        context.sensitivity, first("sensitive_layers"), data.get("weight_zeroing", ()),
        data.get("calibrator_disagreement", ()), data.get("calibration_size", ()),
        data.get("mixed_ranges", ()), first("qdq_fusion"))


def _run_sensitive_layers(ctx: _Context) -> CheckOutcome:
    from quantdbg.backends import OnnxrtRunnerFactory, OrtConfig
    from quantdbg.diagnostics.checks import check_sensitive_layers, confirm_layers
    from quantdbg.sensitivity import SensitivityConfig, VariantEvaluator, analyze_sensitivity

    factory = OnnxrtRunnerFactory(OrtConfig(intra_op_num_threads=ctx.config.threads))
    ctx.sensitivity = analyze_sensitivity(ctx.fp_model, ctx.qmodel, ctx.evals,
                                          SensitivityConfig(mode="local", progress=ctx.progress),
                                          runner_factory=factory)
    with VariantEvaluator(ctx.fp_model, ctx.qmodel, ctx.evals, ctx.metric, factory) as evaluator:  # type: ignore[arg-type]
        confirmation = confirm_layers(evaluator, ctx.sensitivity, ctx.config.confirm_top)
    return check_sensitive_layers(confirmation, ctx.config.sensitive_sqnr_db, ctx.config.dominant_share)


def _run_weight_zeroing(ctx: _Context) -> CheckOutcome:
    from quantdbg.diagnostics.checks import check_weight_zeroing

    return check_weight_zeroing(ctx.fp_model, ctx.qmodel, ctx.config.zeroed_fraction)


def _run_calibrator_disagreement(ctx: _Context) -> CheckOutcome:
    from dataclasses import replace

    from quantdbg.calibration import CollectConfig, collect_stats
    from quantdbg.diagnostics.checks import check_calibrator_disagreement

    calibration = ctx.calibration
    missing = [t for t, s in calibration.stats.items() if s.hist is None]
    if missing:  # e.g. minmax collected no histogram; every calibrator but minmax needs one
        stats = dict(calibration.stats)
        stats.update(collect_stats(ctx.fp_model, ctx.calib, missing,
                                   CollectConfig(histogram=True, num_bins=ctx.config.calib.num_bins)))
        calibration = replace(calibration, stats=stats)
    return check_calibrator_disagreement(calibration, ctx.sensitivity, ctx.config.disagreement_ratio)


def _run_calibration_size(ctx: _Context) -> CheckOutcome:
    from quantdbg.calibration import get_calibrator
    from quantdbg.diagnostics.checks import bootstrap_stability, check_calibration_size, collect_chunked

    tensors = ctx.plan.activation_tensors
    calibrators = {t: get_calibrator(ctx.config.calib.method_for(t, ctx.plan.consumer_ops(t)))
                   for t in tensors}
    histogram = [t for t, c in calibrators.items() if c.needs_histogram]
    chunked = collect_chunked(ctx.fp_model, ctx.calib, tensors, histogram, ctx.config.bootstrap_chunks,
                              ctx.config.calib.num_bins, ctx.config.threads)
    items = bootstrap_stability(chunked, calibrators, ctx.config.bootstrap_rounds, ctx.config.stable_spread,
                                ctx.config.seed)
    return check_calibration_size(items, sum(chunked.sizes))


def _run_mixed_ranges(ctx: _Context) -> CheckOutcome:
    from quantdbg.diagnostics.checks import check_mixed_ranges, mixed_ranges

    scales = {t: r.scale for t, r in ctx.calibration.ranges.items()}
    outputs = [o.name for o in ctx.fp_model.graph.output]
    items = mixed_ranges(ctx.fp_model, ctx.calib, scales, outputs, ctx.config.swamped_fraction,
                         ctx.config.threads)
    return check_mixed_ranges(items, ctx.config.hidden_sqnr_db)


def _run_qdq_fusion(ctx: _Context) -> CheckOutcome:
    from quantdbg.diagnostics.checks import check_qdq_fusion

    return check_qdq_fusion(ctx.qmodel.model)


_RUNNERS: Mapping[str, Callable[[_Context], CheckOutcome]] = {
    "sensitive_layers": _run_sensitive_layers,
    "weight_zeroing": _run_weight_zeroing,
    "calibrator_disagreement": _run_calibrator_disagreement,
    "calibration_size": _run_calibration_size,
    "mixed_ranges": _run_mixed_ranges,
    "qdq_fusion": _run_qdq_fusion,
}


# --------------------------------------------------------------------------------------------
# Text
# --------------------------------------------------------------------------------------------

def format_cell(value: Any) -> str:
    """Formats a table cell: floats to 4 significant digits, infinities as inf/-inf."""
    if isinstance(value, bool) or value is None:
        return "-" if value is None else ("yes" if value else "no")
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return f"{value:.4g}"
    return str(value)


def _text_table(columns: Sequence[str], rows: Sequence[Sequence[Any]], max_rows: int,
                indent: str) -> list[str]:
    shown = [[format_cell(v) for v in row] for row in rows[:max_rows]]
    widths = [max([len(c)] + [len(r[i]) for r in shown]) for i, c in enumerate(columns)]
    line = lambda cells: indent + "  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()  # noqa: E731
    out = [line(columns), indent + "  ".join("-" * w for w in widths)] + [line(r) for r in shown]
    if len(rows) > max_rows:
        out.append(f"{indent}... and {len(rows) - max_rows} more")
    return out


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
        lines.append(f"{i}. [{finding.severity.upper()}] {finding.check}: {finding.title}")
        lines += _text_table(finding.evidence.columns, finding.evidence.rows, max_rows, "     ")
        lines += [f"     fix: {finding.fix}", ""]
    if not report.findings:
        lines += ["No problems found.", ""]
    for run in report.runs:
        if run.status == "failed":
            lines.append(f"check {run.check} could not run: {run.detail}")
    return "\n".join(lines).rstrip() + "\n"
