"""Sections of a sensitivity report: the ranking (chart, table with evidence), the error along the graph."""
from __future__ import annotations

import math
from collections.abc import Sequence

from quantdbg.config import TensorKind
from quantdbg.diagnostics.findings import Cell
from quantdbg.report.plots import png, ranking_figure
from quantdbg.report.sections.base import MAX_BARS, Plot, Section, Table, fmt
from quantdbg.sensitivity import LayerSensitivity, SensitivityReport
from quantdbg.sensitivity.output_space import OutputSpace
from quantdbg.sensitivity.ranks import RankAgreement

WORST_TENSORS = 20
"""Intermediate tensors listed in the error-along-the-graph table."""


def _deficit(values: Sequence[float], higher_is_better: bool) -> list[float]:
    """How far each value is from the best finite one (>= 0; non-finite values draw no bar)."""
    finite = [v for v in values if math.isfinite(v)]
    if not finite:
        return [0.0] * len(values)
    best = max(finite) if higher_is_better else min(finite)
    return [abs(best - v) if math.isfinite(v) else 0.0 for v in values]


def chart_values(report: SensitivityReport) -> tuple[list[float], str]:
    """What the ranking chart draws per layer (longer bar = more sensitive) and its label."""
    layers = report.layers
    values = [layer.value for layer in layers]
    sign = 1.0 if report.higher_is_better else -1.0
    metric, unit = ("output SQNR", " (dB)") if report.metric.startswith("sqnr") else (report.metric, "")
    if report.mode == "local":
        return _deficit(values, True), "noise of the layer's own output above the quietest layer's (dB)"
    if report.mode == "cumulative":
        return [layer.score for layer in layers], "noise-to-signal ratio the layer adds (power ratio)"
    ref = report.reference_value
    if report.mode == "isolated" and ref is not None and math.isfinite(ref):
        return [sign * (ref - v) for v in values], f"{metric} lost with only this layer in INT8{unit}"
    if report.mode == "isolated":  # e.g. SQNR, whose FP32 reference is infinite
        return (_deficit(values, report.higher_is_better),
                f"{metric} with only this layer in INT8, below the least harmful layer's{unit}")
    base = report.baseline_value
    if base is not None and math.isfinite(base):
        return ([sign * (v - base) for v in values],
                f"{metric} regained by taking only this layer out of INT8{unit}")
    return _deficit(values, not report.higher_is_better), f"{metric} regained (relative){unit}"


def _percent(share: float | None) -> float | None:
    return None if share is None else 100.0 * share


def _evidence_cells(layer: LayerSensitivity) -> tuple[Cell, ...]:
    ev = layer.evidence
    if ev is None:
        return (None, None, None, None)
    return (_percent(ev.weight_zero_fraction_per_tensor), _percent(ev.weight_zero_fraction),
            ev.activation_outlier_ratio, ev.best_calibrator)


def value_columns(report: SensitivityReport) -> tuple[str, str | None]:
    """The ranking table's header for ``layer.value`` (with its unit), and for the output SQNR of the
    layer's variant, None where that is the value itself (local mode; an SQNR metric)."""
    sqnr_metric = report.metric.startswith("sqnr")
    if report.mode == "local":
        return "SQNR of its own output (dB)", None
    if report.mode == "cumulative":
        return "noise-to-signal ratio added", "SQNR of its own output (dB)"
    where = "in INT8" if report.mode == "isolated" else "out of INT8"
    if sqnr_metric:
        return f"output SQNR with only this layer {where} (dB)", None
    return f"{report.metric} with only this layer {where}", "output SQNR (dB)"


def _paragraphs(report: SensitivityReport) -> tuple[str, ...]:
    paragraphs = [f"Mode {report.mode}: {report.score_meaning}. {len(report.layers)} quantized layer(s), "
                  f"{report.n_samples} sample(s), {report.n_passes} pass(es), {report.seconds:.1f} s."]
    if report.footprint is not None:
        paragraphs.append(f"{report.footprint.describe()}.")
    if report.reference_value is not None or report.baseline_value is not None:
        paragraphs.append(f"{report.metric}: FP32 {fmt(report.reference_value)}, every layer in INT8 "
                          f"{fmt(report.baseline_value)}.")
    if report.baseline is not None:
        total = report.baseline.total
        paragraphs.append(f"Fully quantized outputs against FP32: SQNR {fmt(total.sqnr_db, '.2f')} dB, "
                          f"cosine {fmt(total.cosine, '.5f')}.")
    return tuple(paragraphs)


def sensitivity_sections(report: SensitivityReport, highlight: Sequence[str] = ()) -> list[Section]:
    """Ranking chart and table (with the evidence), plus the error along the graph in cumulative mode.

    Args:
        report: The ranking.
        highlight: Layers drawn in another colour (e.g. those a fallback plan keeps out of INT8).
    """
    values, label = chart_values(report)
    names = [layer.node for layer in report.layers[:MAX_BARS]]
    plot = Plot(f"Ranking ({report.mode})",
                lambda: png(ranking_figure(names, values[:len(names)], label, highlight=highlight)),
                "Bar chart of layer sensitivity: " + ", ".join(names[:10]))
    sections = [Section(f"Sensitivity ranking ({report.mode})", _paragraphs(report),
                        (_ranking_table(report),), (plot,))]
    if report.output_space is not None and report.agreement is not None:
        sections.append(_agreement_section(report, report.output_space, report.agreement))
    if report.tensors:
        sections.append(_cumulative_section(report))
    return sections


def _ranking_table(report: SensitivityReport) -> Table:
    # One column per fact: the score is the value (or its negative), the SQNR is the value in local
    # mode and for an SQNR metric.
    value, sqnr = value_columns(report)
    rows = tuple((layer.rank, layer.node, layer.op_type, layer.value,
                  *(() if sqnr is None else (None if layer.metrics is None else layer.metrics.sqnr_db,)),
                  ", ".join(sorted({i.calibrator for i in layer.inputs if i.kind is TensorKind.ACTIVATION})),
                  *_evidence_cells(layer)) for layer in report.layers)
    columns = ("rank", "node", "op", value, *(() if sqnr is None else (sqnr,)), "activation calibrator",
               "weights zeroed per-tensor (%)", "weights zeroed in use (%)", "outlier ratio",
               "best calibrator")
    return Table(columns, rows, "sensitivity-ranking", "Most sensitive first.")


def _agreement_paragraphs(report: SensitivityReport, space: OutputSpace,
                          agreement: RankAgreement) -> tuple[str, ...]:
    k, mode = agreement.top_k, report.mode
    first = (f"Output space: each layer alone in INT8 on the first {space.n_batches} batch(es) "
             f"({space.n_samples} sample(s)), scored by {space.metric}. Spearman rank correlation with the "
             f"{mode} ranking: {agreement.spearman:.2f}.")
    if agreement.only_mode or agreement.only_output:
        second = (f"The rankings disagree on their top {k}: only in the {mode} top {k}: "
                  f"{', '.join(agreement.only_mode)}; only in the output-space top {k}: "
                  f"{', '.join(agreement.only_output)}.")
    else:
        second = f"Both rankings put the same {k} layer(s) on top."
    return first, second, ("The fallback search walks the fused ranking (reciprocal-rank fusion of "
                           "both), so the top layers of either are tried first.")


def _agreement_section(report: SensitivityReport, space: OutputSpace, agreement: RankAgreement) -> Section:
    """Where the mode's ranking and the output-space ranking disagree, and the fused ranking."""
    mode_rank = {node: i + 1 for i, node in enumerate(report.ranking)}
    space_rank = {node: i + 1 for i, node in enumerate(space.ranking)}
    only = {**{n: report.mode for n in agreement.only_mode},
            **{n: "output space" for n in agreement.only_output}}
    sqnr = space.metric.startswith("sqnr")  # then the value is the output SQNR: one column
    rows = tuple((i + 1, node, report.layer(node).op_type, mode_rank[node], space_rank[node],
                  *((space.sqnr_db[node],) if sqnr else (space.values[node], space.sqnr_db[node])),
                  only.get(node, "")) for i, node in enumerate(report.fused_ranking))
    values = ("output SQNR with only this layer in INT8 (dB)",) if sqnr else (
        f"{space.metric} with only this layer in INT8", "output SQNR (dB)")
    columns = ("fused rank", "node", "op", f"{report.mode} rank", "output-space rank", *values,
               f"only in the top {agreement.top_k} of")
    table = Table(columns, rows, "sensitivity-agreement", "In the order the fallback search walks.")
    return Section(f"{report.mode.capitalize()} vs output-space ranking",
                   _agreement_paragraphs(report, space, agreement), (table,), level=3)


def _cumulative_section(report: SensitivityReport) -> Section:
    tensors = report.tensors
    worst = sorted(tensors, key=lambda t: t.metrics.sqnr_db)[:WORST_TENSORS]
    rows = tuple((t.tensor, t.node, t.op_type, t.metrics.sqnr_db, t.metrics.cosine) for t in worst)
    text = (f"{len(tensors)} intermediate tensors of the fully quantized model compared with FP32; the "
            f"{WORST_TENSORS} with the lowest SQNR:")
    table = Table(("tensor", "node", "op", "SQNR (dB)", "cosine"), rows, "cumulative-tensors")
    return Section("Error along the graph", (text,), (table,), level=3)
