"""Sections of the automatic flow's result: the verdict with its numbers first, the metric at each step,
the repairs and each tensor's calibrator, the evaluations per phase, then the ranking and the search."""
from __future__ import annotations

from quantdbg.pipeline import AutoResult
from quantdbg.pipeline.records import RepairRecord
from quantdbg.report.sections.base import Section, Table, nested
from quantdbg.report.sections.fallback import fallback_sections
from quantdbg.report.sections.sensitivity import sensitivity_sections


def _loss(result: AutoResult, value: float) -> float | None:
    target = result.target
    if target.kind != "relative_loss" or target.reference is None:
        return None
    return target.relative_loss(value)


def _summary(result: AutoResult) -> Table:
    n, k = result.n_layers, len(result.exclude)
    rows = [("FP32", 0, result.fp32_value, _loss(result, result.fp32_value)),
            (_start_label(result), n, result.int8_value, _loss(result, result.int8_value))]
    if result.recipe.kept_after_start:
        rows.append((f"repaired ({' + '.join(result.recipe.kept_after_start)})", n, result.repaired_value,
                     _loss(result, result.repaired_value)))
    rows.append(("final", n - k, result.final_value, _loss(result, result.final_value)))
    return Table(("model", "layers in INT8", result.metric, "relative loss (%)"), tuple(rows), "auto-summary",
                 f"Task metric at each step ({result.target.describe()}).")


def _start_label(result: AutoResult) -> str:
    if result.recipe.start_choice is not None:
        return "INT8 start (calibrator per tensor)"
    return "default INT8"


def _repairs(records: tuple[RepairRecord, ...]) -> Table:
    rows = tuple((r.repair, r.applied, r.kept, r.before, r.after, r.reason) for r in records)
    return Table(("repair", "applied", "kept", "before", "after", "decision"), rows, "auto-repairs",
                 "Each INT8 repair tried before any layer left INT8, kept only when the task metric "
                 "improved.")


def _calibrators(records: tuple[RepairRecord, ...]) -> tuple[Table, ...]:
    choices = [(r, c) for r in records for c in r.calibrators]
    if not choices:
        return ()
    rows = tuple((c.tensor, c.previous, c.calibrator, r.kept or not c.changed, c.previous_amax, c.amax,
                  c.previous_sqnr, c.sqnr) for r, c in choices)
    columns = ("tensor", "calibrator before", "best calibrator", "in use", "amax before", "amax",
               "local SQNR before (dB)", "local SQNR (dB)")
    return (Table(columns, rows, "auto-calibrators", "The calibrator each activation tensor gets: the one "
                  "whose range gives the layers reading it the best local output SQNR (worst reading layer "
                  "shown)."),)


def _smoothing(records: tuple[RepairRecord, ...]) -> tuple[Table, ...]:
    steps = [(r, r.smoothing) for r in records if r.smoothing is not None and r.smoothing.migrations]
    if not steps:
        return ()
    rows = tuple((", ".join(m.nodes), m.tensor, r.kept, m.act_outlier_before, m.act_outlier_after,
                  m.placement) for r, step in steps for m in step.migrations)  # type: ignore[union-attr]
    return (Table(("nodes", "activation", "kept", "outlier ratio before", "after", "1/s placed"), rows,
                  "auto-smoothing", "SmoothQuant's migrations."),)


def auto_sections(result: AutoResult) -> list[Section]:
    """The verdict and the numbers behind it, then the ranking and the fallback search it walked."""
    k = len(result.exclude)
    paragraphs = (result.message,
                  f"Target: {result.target.describe()}. {result.n_layers} quantized layers; at most "
                  f"{result.max_fallback} may leave INT8; {k} did"
                  f"{f' ({result.recipe.precision.value}): ' + ', '.join(result.exclude) if k else ''}. "
                  f"{result.n_evaluations} task-metric evaluation(s).")
    evaluations = Table(("phase", "evaluations"), tuple(result.evaluations.items()), "auto-evaluations",
                        "Task-metric evaluations per phase (each evaluation made once, resumed runs "
                        "included).")
    tables = (_summary(result), _repairs(result.repairs), *_calibrators(result.repairs),
              *_smoothing(result.repairs), evaluations)
    sections = [Section("Automatic quantization", paragraphs, tables)]
    if result.report is not None:
        sections += nested(sensitivity_sections(result.report, highlight=result.exclude))
    if result.plan is not None and result.plan.evaluations:  # a search ran (its build leads the report)
        sections += nested(fallback_sections(result.plan, commands=False))
    return sections
