"""Sections of results that are not report kinds but show in notebooks: a Q/DQ model's pairs, and a
fallback search's plan with the ranking it walked."""
from __future__ import annotations

from quantdbg.fallback import FallbackResult
from quantdbg.qdq import QuantizedModel
from quantdbg.report.sections.base import Section, Table, nested
from quantdbg.report.sections.fallback import fallback_sections
from quantdbg.report.sections.sensitivity import sensitivity_sections
from quantdbg.report.sections.verdict import VerdictSources, plan_lead

QDQ_TABLE = "qdq-records"
"""The table of a Q/DQ model's pairs (its DataFrame)."""


def quantized_sections(model: QuantizedModel) -> list[Section]:
    """One row per Q/DQ pair: which input of which node, the tensor, its calibrator and scales."""
    rows = tuple((r.node, r.op_type, r.input_index, r.tensor, r.kind.value, r.calibrator, min(r.scale),
                  max(r.scale), len(r.scale), r.axis) for r in model.records)
    columns = ("node", "op", "input", "tensor", "kind", "calibrator", "scale min", "scale max", "scales",
               "axis")
    text = f"{len(model.layers)} quantized layer(s), {len(model.records)} Q/DQ pair(s)."
    if model.excluded:
        precision = model.excluded_precision.value if model.excluded_precision else "?"
        text += f" Kept out of INT8 ({precision}): {', '.join(model.excluded)}."
    return [Section("Quantized model", (text,), (Table(columns, rows, QDQ_TABLE),))]


def fallback_result_sections(result: FallbackResult) -> list[Section]:
    """The verdict and build, the search, then the ranking it walked (the kept layers marked)."""
    evidence = VerdictSources(result.plan, (result.report,))
    return (plan_lead(evidence) + fallback_sections(result.plan, commands=False)
            + nested(sensitivity_sections(result.report, highlight=result.plan.exclude)))
