"""The first screen of a report: the verdict with its numbers, the layers kept out of INT8 and why,
the cheaper INT8 fixes to try before FP16, and the commands that build the result.

Every reason comes from evidence the results already hold: the ranking (the layer's own score, its
output-space SQNR), the layer evidence (local SQNR per calibrator of the activations it reads, weights
rounding to zero, outliers) and the doctor's calibrator comparison.
"""
from __future__ import annotations

import glob
import shlex
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from quantdbg.diagnostics import DoctorReport
from quantdbg.fallback import FallbackPlan
from quantdbg.pipeline import AutoResult
from quantdbg.report.sections.base import Section, fmt
from quantdbg.report.sections.fallback import build_code, value_unit
from quantdbg.sensitivity import LayerSensitivity, SensitivityReport

CALIBRATOR_GAIN_DB = 3.0
"""Local SQNR another calibrator must gain on a layer's input for it to be suggested (the doctor's
threshold for a material disagreement)."""
ZEROED_SHARE = 0.01
"""Share of a layer's non-zero weights rounding to 0 from which it is named as a cause."""
OUTLIER_RATIO = 4.0
"""max|x| / 99.99th percentile from which outliers are named as setting the range."""
SHOWN_LAYERS = 12
"""Layers listed with their reason (the fallback section lists them all)."""


@dataclass(frozen=True)
class VerdictSources:
    """What the first screen draws on, gathered from one result or a bundle's results."""

    plan: FallbackPlan | None
    rankings: tuple[SensitivityReport, ...] = ()
    doctor: DoctorReport | None = None

    def layer(self, node: str) -> tuple[SensitivityReport, LayerSensitivity] | None:
        """The ranking entry of ``node``, preferring a ranking with evidence."""
        found = [(r, layer) for r in self.rankings for layer in r.layers if layer.node == node]
        found.sort(key=lambda pair: pair[1].evidence is None)
        return found[0] if found else None

    def walked(self, node: str) -> tuple[SensitivityReport, LayerSensitivity] | None:
        """The entry of ``node`` in the ranking the plan's search walked, when that ranking is at hand."""
        if self.plan is None:
            return None
        return next(((r, layer) for r in self.rankings if r.ranking == self.plan.ranking
                     for layer in r.layers if layer.node == node), None)


def gather(results: Iterable[object]) -> VerdictSources:
    """The first fallback plan, every sensitivity ranking (the doctor's too) and the doctor report."""
    items = list(results)
    plan = next((r for r in items if isinstance(r, FallbackPlan)), None)
    doctor = next((r for r in items if isinstance(r, DoctorReport)), None)
    rankings = [r for r in items if isinstance(r, SensitivityReport)]
    if doctor is not None and doctor.sensitivity is not None:
        rankings.append(doctor.sensitivity)
    return VerdictSources(plan, tuple(rankings), doctor)


def _int8_value(evidence: VerdictSources) -> float | None:
    """The fully INT8 model's value on the plan's scale (output SQNR, or the task metric)."""
    for ranking in evidence.rankings:
        if evidence.plan is not None and evidence.plan.target.kind == "sqnr" and ranking.baseline:
            return ranking.baseline.total.sqnr_db
        if ranking.baseline_value is not None and evidence.plan is not None and \
                evidence.plan.target.kind != "sqnr":
            return ranking.baseline_value
    return None


def plan_verdict(plan: FallbackPlan, int8_value: float | None, n_layers: int | None) -> str:
    """E.g. ``Target met (output SQNR >= 42 dB): 42.79 dB with 2 of 8 layers kept out of INT8 (fp16);
    fully INT8: 34.91 dB.``"""
    unit = value_unit(plan)
    met = plan.status == "met"
    of = f" of {n_layers}" if n_layers else ""
    head = "Target met" if met else f"Target NOT met ({plan.status.replace('_', ' ')})"
    kept = (f"{len(plan.exclude)}{of} layer(s) kept out of INT8 ({plan.precision.value})" if plan.exclude
            else "every layer in INT8")
    value = f"{fmt(plan.value)}{unit}" if met else f"best {fmt(plan.value)}{unit}"
    base = f"; fully INT8: {fmt(int8_value)}{unit}" if int8_value is not None else ""
    return f"{head} ({plan.target.describe()}): {value} with {kept}{base}."


def _calibrator_reason(layer: LayerSensitivity) -> tuple[str, str, str, float, float] | None:
    """(tensor, in use, better calibrator, SQNR in use, SQNR better) when another calibrator for the
    layer's activation input gains at least :data:`CALIBRATOR_GAIN_DB` of local SQNR."""
    ev = layer.evidence
    if ev is None or not ev.calibrator_sqnr or ev.best_calibrator is None:
        return None
    acts = [i for i in layer.inputs if i.kind.value == "activation"]
    if not acts:
        return None
    used = acts[0].calibrator
    now = ev.recorded_sqnr if ev.recorded_sqnr is not None else ev.calibrator_sqnr.get(used)
    best = ev.calibrator_sqnr.get(ev.best_calibrator)
    if now is None or best is None or ev.best_calibrator == used or not best - now >= CALIBRATOR_GAIN_DB:
        return None
    return acts[0].tensor, used, ev.best_calibrator, float(now), float(best)


def _measured(ranking: SensitivityReport, layer: LayerSensitivity) -> str:
    """What ``ranking`` measured for ``layer``, with its unit."""
    unit = " dB" if ranking.metric.startswith("sqnr") else ""
    metric = "output SQNR" if unit else ranking.metric
    if ranking.mode == "isolated":
        return f"{metric} {fmt(layer.value, '.1f')}{unit} with only this layer in INT8"
    if ranking.mode == "local":
        return f"{fmt(layer.value, '.1f')} dB of SQNR on its own output (local ranking)"
    if ranking.mode == "leave-one-out":
        return f"{metric} {fmt(layer.value)}{unit} with only this layer out of INT8"
    return f"adds a noise-to-signal ratio of {fmt(layer.value)} (cumulative ranking)"


def layer_reason(ranking: SensitivityReport, layer: LayerSensitivity, searched: Sequence[str] = ()) -> str:
    """One line on why ``layer`` loses accuracy in INT8, from the ranking and its evidence.

    Args:
        ranking: The ranking holding ``layer`` (and its evidence).
        layer: The layer.
        searched: The ranking a fallback search walked (its order gives the rank shown, the one the
            plan's table shows); empty: ``ranking``'s own.
    """
    order = tuple(searched) or ranking.ranking
    rank = f"rank {order.index(layer.node) + 1} of {len(order)}" if layer.node in order else ""
    if not rank or order == ranking.ranking:
        parts = [f"{rank}: {_measured(ranking, layer)}" if rank else _measured(ranking, layer)]
    else:  # the evidence comes from another ranking than the one searched: its measure, not its rank
        parts = [f"{rank} in the ranking the search walked", _measured(ranking, layer)]
    parts += _evidence_parts(ranking, layer)
    return "; ".join(parts) + "."


def _evidence_parts(ranking: SensitivityReport, layer: LayerSensitivity) -> list[str]:
    parts = []
    space = ranking.output_space
    if space is not None and layer.node in space.sqnr_db:
        parts.append(f"alone in INT8 the outputs' SQNR is {fmt(space.sqnr_db[layer.node], '.1f')} dB")
    calib = _calibrator_reason(layer)
    if calib is not None:
        tensor, used, best, now, better = calib
        parts.append(f"reads '{tensor}', whose {used} range gives {now:.1f} dB of local SQNR where "
                     f"{best} gives {better:.1f} dB")
    ev = layer.evidence
    if ev is not None and ev.weight_zero_fraction is not None and ev.weight_zero_fraction >= ZEROED_SHARE:
        parts.append(f"{100 * ev.weight_zero_fraction:.1f} % of its non-zero weights round to 0")
    if ev is not None and ev.activation_outlier_ratio is not None and \
            ev.activation_outlier_ratio >= OUTLIER_RATIO:
        parts.append(f"a few outliers set its input range (max/p99.99 = {ev.activation_outlier_ratio:.1f})")
    return parts


def without_it(plan: FallbackPlan, node: str) -> str | None:
    """What the plan's evaluations measured with ``node`` back in INT8 (the other excluded layers
    still out of it)."""
    rest = set(plan.exclude) - {node}
    seen = [e for e in plan.evaluations if set(e.exclude) == rest and not e.met]
    if not seen:
        return None
    others = ("every other layer in INT8 too" if not rest else f"{', '.join(sorted(rest))} still out"
              if len(rest) <= 2 else f"the other {len(rest)} still out")
    return (f"with this layer back in INT8 ({others}) the search measured {fmt(seen[-1].value, '.4g')}"
            f"{value_unit(plan)}, short of {plan.target.describe()}")


def _searched_rank(plan: FallbackPlan | None, node: str) -> str:
    """The reason when no ranking with the layer is at hand: its place in the ranking searched."""
    if plan is None or node not in plan.ranking:
        return "kept out by the fallback search."
    return f"rank {plan.ranking.index(node) + 1} of {len(plan.ranking)} in the ranking the search walked."


def _reason(evidence: VerdictSources, node: str) -> str:
    """The layer's rank and measure in the ranking searched, with the evidence of whichever ranking
    holds it (one rank per layer on the page: the one the plan's table shows)."""
    found, walked = evidence.layer(node), evidence.walked(node)
    if found is None:
        return _searched_rank(evidence.plan, node)
    if walked is None or walked[0] is found[0]:
        return layer_reason(*found, evidence.plan.ranking if evidence.plan is not None else ())
    ranking, layer = walked
    head = f"rank {ranking.ranking.index(node) + 1} of {len(ranking.layers)}: {_measured(ranking, layer)}"
    return "; ".join([head, *_evidence_parts(*found)]) + "."


def layer_lines(evidence: VerdictSources, nodes: Sequence[str]) -> tuple[str, ...]:
    """``node: reason`` for the first :data:`SHOWN_LAYERS` nodes."""
    lines = []
    for node in nodes[:SHOWN_LAYERS]:
        reason = _reason(evidence, node)
        needed = without_it(evidence.plan, node) if evidence.plan is not None else None
        lines.append(f"{node}: " + (f"{reason[:-1]}; {needed}." if needed else reason))
    if len(nodes) > SHOWN_LAYERS:
        lines.append(f"... and {len(nodes) - SHOWN_LAYERS} more (see the fallback plan).")
    return tuple(lines)


def calibrator_fixes(evidence: VerdictSources, nodes: Sequence[str]) -> tuple[str, ...]:
    """``--per-tensor TENSOR=METHOD`` suggestions for the inputs of ``nodes`` where another calibrator
    gains at least :data:`CALIBRATOR_GAIN_DB`, then the doctor's calibrator finding, if any."""
    fixes: dict[str, str] = {}
    for node in nodes:
        found = evidence.layer(node)
        calib = _calibrator_reason(found[1]) if found else None
        if calib is not None and calib[0] not in fixes:
            tensor, used, best, now, better = calib
            flag = shlex.quote(f"{glob.escape(tensor)}={best}")
            fixes[tensor] = (f"--per-tensor {flag}: {node} reads '{tensor}'; local SQNR {now:.1f} -> "
                             f"{better:.1f} dB with {best} instead of {used} (not tried by the search: "
                             "recalibrate, then rerun the search before keeping the layer in FP16).")
    if evidence.doctor is not None:  # the doctor's finding, unless it only names tensors listed above
        fixes.update({f"doctor:{f.check}": f"Doctor ({f.severity.value}): {f.title}. {f.fix}"
                      for f in evidence.doctor.findings
                      if f.check == "calibrator_disagreement" and not set(f.subjects) <= set(fixes)})
    return tuple(fixes.values())


def _n_layers(evidence: VerdictSources) -> int | None:
    return len(evidence.rankings[0].layers) if evidence.rankings else None


def lead_sections(verdict: str, nodes: Sequence[str], precision: str, evidence: VerdictSources,
                  fixes: Sequence[str], code: Sequence[str]) -> list[Section]:
    """The verdict, the layers kept out of INT8 with their reasons, the fixes and the commands."""
    paragraphs = [verdict]
    if nodes:
        paragraphs.append(f"Kept out of INT8 ({precision}), and why:")
    sections = [Section("Verdict", tuple(paragraphs), items=layer_lines(evidence, nodes), lead=True)]
    if fixes:
        sections.append(Section("Cheaper INT8 fixes before FP16", (), items=tuple(fixes), level=3, lead=True))
    if code:
        sections.append(Section("Build", (), code=tuple(code), level=3, lead=True))
    return sections


def plan_lead(evidence: VerdictSources) -> list[Section]:
    """The first screen of a result holding a fallback plan (none without one)."""
    plan = evidence.plan
    if plan is None:
        return []
    verdict = plan_verdict(plan, _int8_value(evidence), _n_layers(evidence))
    return lead_sections(verdict, plan.exclude, plan.precision.value, evidence,
                         calibrator_fixes(evidence, plan.exclude), build_code(plan))


def auto_lead(result: AutoResult) -> list[Section]:
    """The first screen of the automatic flow: its verdict, the repairs it tried first, the build."""
    evidence = VerdictSources(result.plan, (result.report,) if result.report is not None else ())
    tried = tuple(f"{r.repair} (tried, {'kept' if r.kept else 'not kept'}): {result.metric} "
                  f"{fmt(r.before)} -> {fmt(r.after)}; {r.reason}" for r in result.repairs)
    fixes = tried + calibrator_fixes(evidence, result.exclude)
    code = build_code(result.plan) if result.plan is not None else ()  # all-INT8 models get built too
    return lead_sections(result.message, result.exclude, result.recipe.precision.value, evidence, fixes,
                         code)

