"""The report's first screen: the verdict with numbers, each layer kept out of INT8 with the evidence
for why, the cheaper INT8 fix the evidence points to, then the build commands."""
from __future__ import annotations

import shlex

from quantdbg import report
from quantdbg.fallback import FallbackTarget, search_fallback
from quantdbg.report import ReportBundle
from quantdbg.report.sections.registry import sections_of
from quantdbg.report.sections.verdict import gather, layer_reason, plan_verdict
from quantdbg.sensitivity import LayerEvidence, LayerSensitivity, SensitivityReport
from quantdbg.sensitivity.report import QuantizedInput


def _layer(node: str, rank: int, value: float, tensor: str, used: str, sqnr: dict[str, float] | None,
           zeroed: float = 0.0) -> LayerSensitivity:
    inputs = (QuantizedInput(0, tensor, "activation", used, 0.02, 0.02, 1),
              QuantizedInput(1, f"{node}.w", "weight", "absmax", 0.001, 0.003, 8))
    evidence = None if sqnr is None else LayerEvidence(
        weight_zero_fraction=zeroed, calibrator_sqnr=sqnr, recorded_sqnr=sqnr[used],
        best_calibrator=max(sqnr, key=sqnr.__getitem__), activation_outlier_ratio=1.2)
    return LayerSensitivity(node, "Conv", inputs, rank, -value, value, evidence=evidence)


RANKING = SensitivityReport("isolated", "sqnr", True, (
    _layer("conv2", 1, 36.0, "relu[1]", "entropy", {"entropy": 28.8, "mse": 39.5, "minmax": 37.0}, 0.02),
    _layer("fc2", 2, 44.8, "flat", "entropy", {"entropy": 40.0, "mse": 41.0}),
    _layer("stem", 3, 48.0, "input", "entropy", None)))


def _plan(threshold: float = 42.0):
    # Additive SQNR model: keeping conv2 out gains 6 dB, fc2 gains 2 dB, from 35.
    gains = {"conv2": 6.0, "fc2": 2.0, "stem": 0.5}
    target = FallbackTarget.min_sqnr(threshold)
    return search_fallback(RANKING, lambda ex: 35.0 + sum(gains[n] for n in ex), target)


def test_layer_reasons_come_from_the_evidence():
    assert layer_reason(RANKING, RANKING.layers[0]) == (
        "rank 1 of 3: output SQNR 36.0 dB with only this layer in INT8; reads 'relu[1]', whose entropy range "
        "gives 28.8 dB of local SQNR where mse gives 39.5 dB; 2.0 % of its non-zero weights round to 0.")
    # 1 dB better with mse is no reason; a layer without evidence keeps only its rank.
    assert layer_reason(RANKING, RANKING.layers[1]) == \
        "rank 2 of 3: output SQNR 44.8 dB with only this layer in INT8."
    assert layer_reason(RANKING, RANKING.layers[2]).startswith("rank 3 of 3:")


def test_verdict_numbers_and_the_unmet_case():
    plan = _plan()
    assert plan.exclude == ("conv2", "fc2") and plan.value == 43.0
    assert plan_verdict(plan, 34.9, 3) == ("Target met (output SQNR >= 42 dB): 43 dB with 2 of 3 layer(s) "
                                           "kept out of INT8 (fp16); fully INT8: 34.9 dB.")
    unmet = _plan(60.0)
    assert plan_verdict(unmet, None, None).startswith(
        "Target NOT met (unreachable) (output SQNR >= 60 dB): best 43.5 dB with 3 layer(s)")


def test_first_screen_names_each_layer_the_fix_and_the_commands():
    plan = _plan()
    bundle = ReportBundle("b", (RANKING, plan))
    verdict, fixes, build = [s for s in sections_of(bundle) if s.lead]
    assert [item.split(": ")[0] for item in verdict.items] == ["conv2", "fc2"]
    # fc2: the search measured conv2 alone out of INT8 (fc2 back in) at 41 dB, short of the target.
    assert verdict.items[1].endswith("with this layer back in INT8 (conv2 still out) the search measured "
                                     "41 dB, short of output SQNR >= 42 dB.")
    [fix] = fixes.items
    flag = fix.split(": ")[0]
    assert shlex.split(flag) == ["--per-tensor", "relu[[]1]=mse"]  # a glob matching only that tensor
    assert "28.8 -> 39.5 dB with mse instead of entropy" in fix
    commands = plan.commands
    weakly = commands.trtexec_weakly_typed
    assert build.code == (f"# trtexec (strongly typed)\n{commands.trtexec}\n"
                          f"# trtexec (weakly typed, excluded layers pinned)\n{weakly}\n"
                          f"# polygraphy convert\n{commands.polygraphy_convert}\n"
                          f"# polygraphy run (TensorRT vs ONNX Runtime)\n{commands.polygraphy_run}\n"
                          "# ModelOpt: --nodes_to_exclude conv2 fc2",)
    markdown = report.render_markdown(bundle)
    assert markdown.index("## Verdict") < markdown.index("- conv2: rank 1") < markdown.index("```") \
        < markdown.index("## Sensitivity ranking")
    page = report.render_html(bundle, plots=False)
    assert page.index('<div class="lead">') < page.index("<strong>conv2</strong>") < page.index("<nav>")


def test_no_plan_no_first_screen():
    assert gather((RANKING,)).plan is None
    assert not any(s.lead for s in sections_of(ReportBundle("b", (RANKING,))))


def test_a_local_ranking_reason_reads_its_own_output_sqnr():
    from dataclasses import replace

    local = SensitivityReport("local", "local sqnr (dB)", True, (replace(RANKING.layers[1], rank=1),))
    assert layer_reason(local, local.layers[0]) == \
        "rank 1 of 1: 44.8 dB of SQNR on its own output (local ranking)."


def test_a_plan_alone_names_each_layer_by_its_place_in_the_ranking_searched():
    plan = _plan()
    verdict = sections_of(plan)[0]
    assert verdict.items == (
        "conv2: rank 1 of 3 in the ranking the search walked; with this layer back in INT8 (fc2 still out) "
        "the search measured 37 dB, short of output SQNR >= 42 dB.",
        "fc2: rank 2 of 3 in the ranking the search walked; with this layer back in INT8 (conv2 still out) "
        "the search measured 41 dB, short of output SQNR >= 42 dB.")
