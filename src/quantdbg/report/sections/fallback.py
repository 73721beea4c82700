"""Sections of a fallback plan: the outcome, the layers kept out of INT8 (``exclude``), every evaluation,
build commands."""
from __future__ import annotations

import shlex
from collections.abc import Mapping
from types import MappingProxyType

from quantdbg.backends.tensorrt.commands import as_comment
from quantdbg.fallback import FallbackPlan
from quantdbg.fallback.plan import Purpose
from quantdbg.report.plots import fallback_figure, png
from quantdbg.report.sections.base import Plot, Section, Table

SHOWN_NODES = 8
"""Excluded layers listed per evaluation row."""

PHASE_MEANING: Mapping[Purpose, str] = MappingProxyType({
    "search": "ranked prefixes", "group": "group testing", "exchange": "smaller sets by exchanges",
    "prune": "greedy pruning", "verify": "verification"})
"""What each phase of the search (an evaluation's purpose) does."""


def phases_paragraph(plan: FallbackPlan) -> str:
    """E.g. ``Evaluations by phase: 4 search (ranked prefixes), 12 group (group testing), 1 verify ...``."""
    counts = ", ".join(f"{n} {phase} ({PHASE_MEANING[phase]})" for phase, n in plan.phases.items())
    return f"Evaluations by phase: {counts or 'none'}."


def is_sqnr(plan: FallbackPlan) -> bool:
    """Whether the plan's values are output SQNRs in dB (an SQNR target, or a metric target on SQNR)."""
    return plan.target.kind == "sqnr" or (plan.metric or "").startswith("sqnr")


def value_unit(plan: FallbackPlan) -> str:
    """The unit after one of the plan's values in running text (``" dB"`` or nothing)."""
    return " dB" if is_sqnr(plan) else ""


def metric_label(plan: FallbackPlan) -> str:
    """The searched value's name with its unit, for an axis or a column."""
    if is_sqnr(plan):
        return "output SQNR (dB)"
    name = plan.metric or "task metric"
    return f"{name} (relative-loss target)" if plan.target.kind == "relative_loss" else name


def build_code(plan: FallbackPlan) -> tuple[str, ...]:
    """The build commands as shell lines, each after a comment saying what it does (placeholder
    paths ``MIXED.onnx`` until the plan knows the mixed model's file)."""
    lines = [f"# {what}\n{command}" for what, command in plan.commands.lines()]
    if not any("modelopt" in line for line in lines) and plan.exclude:  # a name's line break stays commented
        lines.append(as_comment(f"ModelOpt: --nodes_to_exclude {shlex.join(plan.exclude)}"))
    return ("\n".join(lines),)


def fallback_sections(plan: FallbackPlan, commands: bool = True) -> list[Section]:
    """The outcome, the layers kept out of INT8, every evaluation (chart and table), and the build
    commands unless ``commands`` is False (the report's first screen shows them)."""
    paragraphs = [plan.message or f"Status: {plan.status}.",
                  f"Target: {plan.target.describe()}. Strategy {plan.strategy}: {plan.n_evaluations} "
                  f"evaluation(s) of a budget of {plan.budget}, plus the verification; set is "
                  f"{'1-minimal' if plan.minimal else 'not proven minimal'}; the layers kept out "
                  f"of INT8 compute in {plan.precision.value}.", phases_paragraph(plan)]
    if plan.footprint is not None:
        paragraphs.append(f"{plan.footprint.describe()}.")
    rank = {node: i + 1 for i, node in enumerate(plan.ranking)}
    kept = Table(("node", "rank"), tuple((node, rank.get(node)) for node in plan.exclude), "fallback-exclude",
                 "Layers kept out of INT8.")
    evals = Table(("#", "purpose", "layers kept out of INT8", metric_label(plan), "met", "exclude"),
                  tuple((i, e.purpose, len(e.exclude), e.value, e.met, ", ".join(e.exclude[:SHOWN_NODES])
                         + (" ..." if len(e.exclude) > SHOWN_NODES else ""))
                        for i, e in enumerate(plan.evaluations, 1)),
                  "fallback-evaluations")
    sizes = [len(e.exclude) for e in plan.evaluations]
    values = [e.value for e in plan.evaluations]
    met = [e.met for e in plan.evaluations]
    def draw() -> bytes:
        return png(fallback_figure(sizes, values, met, plan.target.threshold, metric_label(plan)))

    plots = (Plot("Fallback search", draw, "Metric of each evaluation"),) if plan.evaluations else ()
    code = build_code(plan) if commands else ()
    return [Section("Fallback plan", tuple(paragraphs), (evals, kept), plots, code)]
