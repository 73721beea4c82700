"""Sensitive layers: the top of a cheap (local) ranking, confirmed by quantizing each layer alone."""
from __future__ import annotations

import math
from dataclasses import dataclass

from quantdbg._json import Serializable
from quantdbg.backends import OnnxrtRunnerFactory, OrtConfig
from quantdbg.diagnostics.checks.base import Check, CheckContext, CheckOutcome
from quantdbg.diagnostics.findings import Evidence, Finding, Severity
from quantdbg.quant_math import nsr
from quantdbg.sensitivity import SensitivityConfig, SensitivityReport, analyze_sensitivity
from quantdbg.variants import VariantEvaluator


@dataclass(frozen=True)
class LayerConfirmation(Serializable):
    """A layer from the cheap ranking, measured alone (only its Q/DQ pairs active).

    Attributes:
        node: Node name.
        op_type: Its op type.
        local_rank: Its rank in the local ranking.
        local_sqnr_db: Its own output's SQNR in local mode.
        isolated_sqnr_db: Model output SQNR with only this layer in INT8.
        isolated_value: The task metric with only this layer in INT8.
        noise_share: Output noise power with only this layer in INT8 / with every layer in INT8.
    """

    node: str
    op_type: str
    local_rank: int
    local_sqnr_db: float
    isolated_sqnr_db: float
    isolated_value: float
    noise_share: float


@dataclass(frozen=True)
class Confirmation(Serializable):
    """The top of a cheap ranking, measured in isolation.

    Attributes:
        full_sqnr_db: Output SQNR of the fully quantized model.
        layers: One entry per confirmed layer, most harmful first.
        metric: The task metric in ``LayerConfirmation.isolated_value`` (``"sqnr"``: the output
            SQNR again).
        full_value: That metric for the fully quantized model.
    """

    full_sqnr_db: float
    layers: tuple[LayerConfirmation, ...]
    metric: str = "sqnr"
    full_value: float = math.nan


def confirm_layers(evaluator: VariantEvaluator, ranking: SensitivityReport, top: int) -> Confirmation:
    """Measures the top layers of a cheap ranking in isolation.

    Args:
        evaluator: An evaluator on the evaluation data.
        ranking: The (local) ranking.
        top: How many layers to confirm.

    Returns:
        The fully quantized model's output SQNR and the confirmed layers, most harmful first.
    """
    full = evaluator.run(evaluator.layers)
    full_sqnr = full.comparison.total.sqnr_db if full.comparison is not None else math.nan
    found = []
    for layer in ranking.layers[:top]:
        result = evaluator.run((layer.node,))
        sqnr = result.comparison.total.sqnr_db if result.comparison is not None else math.nan
        share = nsr(sqnr) / nsr(full_sqnr) if nsr(full_sqnr) > 0 else math.nan
        found.append(LayerConfirmation(layer.node, layer.op_type, layer.rank, float(layer.value), float(sqnr),
                                       float(result.value), float(share)))
    found.sort(key=lambda c: (c.isolated_sqnr_db, c.local_rank))
    return Confirmation(float(full_sqnr), tuple(found), evaluator.metric.name, float(full.value))


HIGH_SQNR_DB = 20.0
"""Isolated output SQNR below which the finding is high."""


def check_sensitive_layers(confirmation: Confirmation, max_sqnr_db: float = 30.0,
                           dominant_share: float = 0.5) -> CheckOutcome:
    """Names the layers that hurt the output on their own.

    A confirmed layer is named when, quantized alone, the output SQNR falls below
    ``max_sqnr_db`` or it causes at least ``dominant_share`` of the fully quantized model's
    output noise.

    Args:
        confirmation: Isolated measurements (see :func:`confirm_layers`).
        max_sqnr_db: Isolated output SQNR below which a layer is sensitive.
        dominant_share: Share of the full model's output noise that makes a layer the culprit.

    Returns:
        One finding (high below 20 dB isolated SQNR, medium below ``max_sqnr_db``, else low).
    """
    bad = [c for c in confirmation.layers
           if c.isolated_sqnr_db < max_sqnr_db or c.noise_share >= dominant_share]
    if not bad:
        return CheckOutcome((), (confirmation,))
    worst = min(c.isolated_sqnr_db for c in bad)
    severity = (Severity.HIGH if worst < HIGH_SQNR_DB else Severity.MEDIUM if worst < max_sqnr_db
                else Severity.LOW)
    with_metric = confirmation.metric != "sqnr"  # else the metric repeats the SQNR column
    rows = tuple((c.node, c.op_type, c.local_rank, c.local_sqnr_db, c.isolated_sqnr_db, c.noise_share)
                 + ((c.isolated_value,) if with_metric else ()) for c in bad)
    columns = ("node", "op", "local rank", "local SQNR (dB)", "isolated output SQNR (dB)",
               "share of INT8 noise") + ((f"isolated {confirmation.metric}",) if with_metric else ())
    finding = Finding(
        "sensitive_layers", severity, -worst,
        f"{len(bad)} layer(s) degrade the output on their own: {', '.join(c.node for c in bad)} (fully INT8 "
        f"output SQNR {confirmation.full_sqnr_db:.1f} dB)", tuple(c.node for c in bad),
        Evidence(columns, rows),
        "Run `quantdbg fallback` to find the smallest set to keep in FP16 (these layers first), or try "
        "another calibrator for their inputs (see the calibrator finding and the ranking's evidence).")
    return CheckOutcome((finding,), (confirmation,))


def run(ctx: CheckContext) -> CheckOutcome:
    """The doctor's run: a local ranking with evidence (kept in the context for the later checks),
    its top layers confirmed in isolation."""
    factory = OnnxrtRunnerFactory(OrtConfig(intra_op_num_threads=ctx.config.threads))
    config = SensitivityConfig(mode="local", progress=ctx.progress, evidence=True)
    ctx.sensitivity = analyze_sensitivity(ctx.fp_model, ctx.qmodel, ctx.evals, config, runner_factory=factory)
    with VariantEvaluator(ctx.fp_model, ctx.qmodel, ctx.evals, ctx.metric, factory) as evaluator:  # type: ignore[arg-type]
        confirmation = confirm_layers(evaluator, ctx.sensitivity, ctx.config.confirm_top)
    return check_sensitive_layers(confirmation, ctx.config.sensitive_sqnr_db, ctx.config.dominant_share)


CHECK = Check("sensitive_layers", run)
