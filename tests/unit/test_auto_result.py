"""AutoResult: the verdict of every outcome with its numbers, the JSON document, and the report section
(the verdict first, the metric at each step, the repairs and each tensor's calibrator)."""
from __future__ import annotations

import html
import json
import re

import pytest

from quantdbg import report
from quantdbg.config import CalibConfig, Precision
from quantdbg.fallback import FallbackPlan, FallbackTarget
from quantdbg.fallback.plan import FallbackEvaluation
from quantdbg.pipeline import AutoRecipe, AutoResult
from quantdbg.pipeline.records import RepairRecord, TensorChoice
from quantdbg.report.results import kind_of
from quantdbg.report.sections.registry import sections_of

TARGET = FallbackTarget.max_relative_loss(1.0, reference=0.9)
CHOICE = TensorChoice("x", "entropy", "minmax", 3.2, 40.0, 1.5, 30.2)
CALIBRATOR = RepairRecord("calibrator", True, True, 0.1, 0.5, "1 of 2 activation tensor(s) change calibrator",
                          (CHOICE, TensorChoice("r", "entropy", "entropy", 2.0, 2.0, 35.0, 35.0)))
SMOOTHQUANT = RepairRecord("smoothquant", False, False, 0.5, None, "no outlier channels")
LAYERS = ("a", "b", "c", "d", "e", "f", "g", "h")


def _plan(status: str, exclude: tuple[str, ...], value: float,
          evaluations: tuple[FallbackEvaluation, ...]) -> FallbackPlan:
    return FallbackPlan(status, exclude, TARGET, value, "bisect", LAYERS, evaluations, 8, False,  # type: ignore[arg-type]
                        Precision.FP16, "plan message")


def _result(outcome: str, final: float, exclude: tuple[str, ...] = (), plan: FallbackPlan | None = None,
            repairs: tuple[RepairRecord, ...] = (CALIBRATOR, SMOOTHQUANT)) -> AutoResult:
    recipe = AutoRecipe(CalibConfig(per_tensor={"x": "minmax"}), exclude=exclude, repairs=repairs)
    return AutoResult(outcome, TARGET, "accuracy", 0.9, 0.1, 0.5, final, 8, 2, recipe,  # type: ignore[arg-type]
                      {"reference": 1, "int8": 1, "calibrator": 1, "search": 5}, None, plan)


SEARCHED = (FallbackEvaluation(("a",), 0.6, False, "search"),
            FallbackEvaluation(("a", "b"), 0.7, False, "search"),
            FallbackEvaluation(LAYERS[:4], 0.8, False, "search"),
            FallbackEvaluation(LAYERS, 0.895, True, "search"))


def test_verdicts_name_the_numbers():
    assert _result("int8", 0.895, repairs=()).message == (
        "Default INT8 meets relative loss <= 1 % of 0.9: accuracy 0.895 (loss 0.556 %; FP32 0.9, default "
        "INT8 "
        "0.1); all 8 layers stay in INT8.")
    assert _result("repaired", 0.895).message == (
        "INT8 repaired by calibrator meets relative loss <= 1 % of 0.9: accuracy 0.895 (loss 0.556 %; FP32 "
        "0.9, "
        "default INT8 0.1, repaired 0.5); all 8 layers stay in INT8.")
    met = _plan("met", ("a",), 0.895, SEARCHED[:1])
    assert _result("fallback", 0.895, ("a",), met).message == (
        "Met relative loss <= 1 % of 0.9 with 1 of 8 layers (12 %) out of INT8 in fp16: accuracy 0.895 (loss "
        "0.556 %; FP32 0.9, default INT8 0.1, repaired 0.5).")
    spread = _plan("met", LAYERS, 0.895, SEARCHED)
    assert _result("spread", 0.7, ("a", "b"), spread).message == (
        "Missed relative loss <= 1 % of 0.9: no small set of layers meets it, the error is spread over the "
        "model: "
        "the search needed 8 of 8 layers out of INT8 (accuracy 0.895 (loss 0.556 %)), more than the limit "
        "of 2 "
        "(25 %). Stopped at the best set within the limit of 2: 2 of 8 layers (25 %) out of INT8 in fp16, "
        "accuracy 0.7 (loss 22.2 %; FP32 0.9, default INT8 0.1, repaired 0.5).")
    unreachable = _plan("unreachable", LAYERS, 0.8, SEARCHED[:3])
    assert _result("unreachable", 0.7, ("a", "b"), unreachable).message == (
        "Missed relative loss <= 1 % of 0.9: no set of layers the search tried meets it (3 evaluations; the "
        "best, "
        "4 layer(s) out of INT8, gives accuracy 0.8 (loss 11.1 %)). Stopped at the best set within the "
        "limit of "
        "2: 2 of 8 layers (25 %) out of INT8 in fp16, accuracy 0.7 (loss 22.2 %; FP32 0.9, default INT8 0.1, "
        "repaired 0.5).")
    failed = _plan("verification_failed", ("a", "b"), 0.85,
                   (*SEARCHED[:1], FallbackEvaluation(("a", "b"), 0.893, True, "search")))
    assert _result("verification_failed", 0.85, ("a", "b"), failed).message == (
        "Missed relative loss <= 1 % of 0.9: the search's set of 2 layer(s) met it in the search, but the "
        "real "
        "mixed model (fp16) gives accuracy 0.85 (loss 5.56 %). Stopped at the best set within the limit of "
        "2: 2 of "
        "8 layers (25 %) out of INT8 in fp16, accuracy 0.85 (loss 5.56 %; FP32 0.9, default INT8 0.1, "
        "repaired "
        "0.5).")


def test_properties():
    result = _result("fallback", 0.895, ("a",), _plan("met", ("a",), 0.895, SEARCHED[:1]))
    assert result.met and result.exclude == ("a",) and result.repairs == (CALIBRATOR, SMOOTHQUANT)
    assert result.n_evaluations == 8 and result.recipe.kept == ("calibrator",)
    assert not _result("spread", 0.7, ("a",)).met
    with pytest.raises(TypeError):
        result.evaluations["search"] = 1  # type: ignore[index]


def test_json_document_round_trips_without_the_model(tmp_path):
    result = _result("spread", 0.7, ("a", "b"), _plan("met", LAYERS, 0.895, SEARCHED))
    data = json.loads(json.dumps(result.to_dict()))
    assert data["format"] == "quantdbg.auto/1" and data["recipe"]["format"] == "quantdbg.auto_recipe/1"
    assert data["plan"]["format"] == "quantdbg.fallback_plan/2"
    assert (data["met"], data["exclude"], data["message"]) == (False, ["a", "b"], result.message)
    assert "model" not in data
    assert AutoResult.from_dict(data) == result
    assert AutoResult.read(result.write(tmp_path / "plan.json")) == result
    loaded = report.load_result(tmp_path / "plan.json")
    assert type(loaded) is AutoResult and kind_of(loaded) == "auto"


def _table(page: str, css_id: str) -> list[list[str]]:
    body = re.search(rf'<table id="{css_id}">(.*?)</table>', page, re.S)
    assert body, css_id
    rows = re.findall(r"<tr>(.*?)</tr>", body.group(1), re.S)
    return [re.findall(r"<t[dh][^>]*>(.*?)</t[dh]>", row) for row in rows]


def test_the_report_section_opens_with_the_verdict():
    result = _result("fallback", 0.895, ("a",), _plan("met", ("a",), 0.895, SEARCHED[:1]))
    (verdict, *lead), (section, fallback) = ([s for s in sections_of(result) if s.lead == flag]
                                             for flag in (True, False))
    assert verdict.title == "Verdict" and verdict.paragraphs[0] == result.message
    assert verdict.items[0].startswith("a: ")  # the layer kept out of INT8, with why
    assert [s.title for s in lead] == ["Cheaper INT8 fixes before FP16", "Build"]
    assert lead[0].items == ("calibrator (tried, kept): accuracy 0.1 -> 0.5; " + CALIBRATOR.reason,
                             "smoothquant (tried, not kept): accuracy 0.5 -> n/a; " + SMOOTHQUANT.reason)
    assert fallback.code == ()  # the build commands lead the report instead
    assert section.title == "Automatic quantization" and section.paragraphs[0] == result.message
    assert section.paragraphs[1] == ("Target: relative loss <= 1 % of 0.9. 8 quantized layers; at most 2 may "
                                     "leave INT8; 1 did (fp16): a. 8 task-metric evaluation(s).")
    assert fallback.title == "Fallback plan" and fallback.level == 3
    page = report.render_html(result, plots=False)
    assert page.index(html.escape(result.message, quote=False)) < page.index("<nav>") < \
        page.index('id="auto-summary"')
    assert _table(page, "auto-summary")[1:] == [
        ["FP32", "0", "0.9", "0"], ["default INT8", "8", "0.1", "88.89"],
        ["repaired (calibrator)", "8", "0.5", "44.44"], ["final", "7", "0.895", "0.5556"]]
    assert [row[:3] for row in _table(page, "auto-repairs")[1:]] == [["calibrator", "yes", "yes"],
                                                                    ["smoothquant", "no", "no"]]
    assert _table(page, "auto-calibrators")[1:] == [
        ["x", "entropy", "minmax", "yes", "3.2", "40", "1.5", "30.2"],
        ["r", "entropy", "entropy", "yes", "2", "2", "35", "35"]]
    assert _table(page, "auto-evaluations")[1:] == [["reference", "1"], ["int8", "1"], ["calibrator", "1"],
                                                    ["search", "5"]]
    assert result._repr_html_().startswith('<div class="quantdbg-report">')


def test_the_dataframe_is_the_summary():
    pytest.importorskip("pandas")
    frame = report.to_dataframe(_result("int8", 0.895, repairs=()))
    assert list(frame["model"]) == ["FP32", "default INT8", "final"]
    assert list(frame["accuracy"]) == [0.9, 0.1, 0.895]
