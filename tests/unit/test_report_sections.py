"""What each report section holds for a given result: its titles, tables, rows and values."""
from __future__ import annotations

import math

import numpy as np
import pytest

from quantdbg.calibration import CalibrationResult, CalibratorComparison, TensorRange, TensorStats
from quantdbg.config import CalibConfig, TensorKind
from quantdbg.diagnostics import DoctorReport, Evidence, Finding, LintReport, Severity
from quantdbg.diagnostics.checks.calibration_size import ScaleStability
from quantdbg.diagnostics.checks.mixed_ranges import MixedRange
from quantdbg.diagnostics.checks.weight_zeroing import WeightZeroing
from quantdbg.diagnostics.doctor import CheckRun
from quantdbg.diagnostics.findings import NO_EVIDENCE
from quantdbg.errors import ConfigError
from quantdbg.fallback import FallbackTarget, search_fallback
from quantdbg.report import ReportBundle
from quantdbg.report.sections.base import Section, Table
from quantdbg.report.sections.calibration import calibrator_comparison_section, clipped_share
from quantdbg.report.sections.registry import sections_of
from quantdbg.report.sections.sensitivity import chart_values
from quantdbg.sensitivity import LayerEvidence, LayerSensitivity, SensitivityReport
from quantdbg.sensitivity.report import QuantizedInput


def _tables(sections: list[Section]) -> dict[str, Table]:
    return {t.css_id: t for s in sections for t in s.tables if t.css_id}


# ----- calibration ------------------------------------------------------------------------------

def _calibration() -> CalibrationResult:
    # |x| histogram over [0, 4) in 4 bins: 6 values below 1, 3 in [1, 2), 1 in [3, 4).
    hist = np.array([6, 3, 0, 1], np.int64)
    stats = {"a": TensorStats("a", -3.5, 2.0, 10, 0, hist, 4.0),
             "b": TensorStats("b", 0.0, 1.0, 8, 2)}
    ranges = {"a": TensorRange("a", -1.5, 1.5, "percentile"), "b": TensorRange("b", -1.0, 1.0, "minmax")}
    return CalibrationResult(ranges, stats, CalibConfig(method="entropy"), 3, 12)


def test_calibration_section_holds_the_ranges_and_nothing_computed():
    [section] = sections_of(_calibration())
    assert section.title == "Calibration" and section.level == 2 and section.plots == ()
    assert section.paragraphs == (
        "2 activation tensor(s) calibrated on 12 sample(s) in 3 batch(es); default calibrator entropy.",
        "1 tensor(s) produced NaN/Inf values, left out of the statistics: b (2).")
    [table] = section.tables
    assert table.css_id == "calibration-ranges"
    assert table.columns == ("tensor", "calibrator", "amax", "scale", "min", "max", "clipped share",
                             "non-finite")
    # amax 1.5 lies in bin [1, 2): the values above it are those of the bins after it, 1 of 10.
    scale = [float(np.float32(amax / 127)) for amax in (1.5, 1.0)]  # scales are float32, as in the model
    assert table.rows == (("a", "percentile", 1.5, scale[0], -3.5, 2.0, 0.1, 0),
                          ("b", "minmax", 1.0, scale[1], 0.0, 1.0, None, 2))


def test_clipped_share_by_hand():
    stats = _calibration().stats["a"]
    assert clipped_share(stats, 0.5) == 0.4  # bins [1, 4): 4 of 10
    assert clipped_share(stats, 3.5) == 0.0  # the last bin holds the clip
    assert clipped_share(None, 1.0) is None


def _comparison(tensor: str, ratio: float, hist: tuple[int, ...] = (4, 1)) -> CalibratorComparison:
    return CalibratorComparison(tensor, "minmax", {"minmax": 2.0 * ratio, "mse": 2.0},
                                {"minmax": 30.0, "mse": 35.0},
                                {}, "mse", ratio, hist, 0.5)


def test_calibrator_comparison_section_lists_every_calibrator():
    section = calibrator_comparison_section([_comparison("x", 1.5), _comparison("y", 4.0, hist=())])
    assert section.level == 3 and section.title == "Calibrators compared"
    [table] = section.tables
    assert table.css_id == "calibrator-comparison"
    assert table.columns == ("tensor", "in use", "amax minmax", "amax mse", "max/min", "best",
                             "SQNR minmax (dB)", "SQNR mse (dB)")
    assert table.rows == (("x", "minmax", 3.0, 2.0, 1.5, "mse", 30.0, 35.0),
                          ("y", "minmax", 8.0, 2.0, 4.0, "mse", 30.0, 35.0))
    [plot] = section.plots  # only x has a histogram to draw; the alternative text names y (most disputed) too
    assert plot.alt == "Histograms of y, x"
    assert "Histograms: the 1 tensor(s)" in section.paragraphs[0]


# ----- sensitivity ------------------------------------------------------------------------------

def _layer(node: str, rank: int, value: float, evidence: LayerEvidence | None = None) -> LayerSensitivity:
    inputs = (QuantizedInput(0, f"{node}.in", TensorKind.ACTIVATION, "entropy", 0.1, 0.1, 1),
              QuantizedInput(1, f"{node}.w", TensorKind.WEIGHT, "minmax", 0.01, 0.02, 8))
    return LayerSensitivity(node, "Conv", inputs, rank, -value, value, evidence=evidence)


def _local() -> SensitivityReport:
    evidence = LayerEvidence(weight_zero_fraction=0.25, weight_zero_fraction_per_tensor=0.5,
                             activation_outlier_ratio=3.0, best_calibrator="mse")
    layers = (_layer("a", 1, 20.0, evidence), _layer("b", 2, 35.0))
    return SensitivityReport("local", "sqnr (dB)", True, layers, n_samples=8, n_passes=1, seconds=0.25)


def test_sensitivity_section_ranks_every_layer_with_its_evidence():
    [section] = sections_of(_local())
    assert section.title == "Sensitivity ranking (local)"
    assert section.paragraphs[0].endswith("2 quantized layer(s), 8 sample(s), 1 pass(es), 0.2 s.")
    [table] = section.tables
    assert (table.css_id, table.caption) == ("sensitivity-ranking", "Most sensitive first.")
    # Local mode: the value is the SQNR of the layer's own output, shown once; zeroed weights in %.
    assert table.columns[:4] == ("rank", "node", "op", "SQNR of its own output (dB)")
    assert table.columns[5:7] == ("weights zeroed per-tensor (%)", "weights zeroed in use (%)")
    assert table.rows == ((1, "a", "Conv", 20.0, "entropy", 50.0, 25.0, 3.0, "mse"),
                          (2, "b", "Conv", 35.0, "entropy", None, None, None, None))
    [plot] = section.plots
    assert plot.title == "Ranking (local)" and plot.alt == "Bar chart of layer sensitivity: a, b"


def test_chart_values_by_mode():
    assert chart_values(_local()) == ([15.0, 0.0], "noise of the layer's own output above the quietest "
                                                   "layer's (dB)")
    isolated = SensitivityReport("isolated", "top1", True, (_layer("a", 1, 0.9), _layer("b", 2, 0.95)),
                                 reference_value=0.97)
    values, label = chart_values(isolated)
    assert values == pytest.approx([0.07, 0.02]) and label == "top1 lost with only this layer in INT8"
    infinite = SensitivityReport("isolated", "sqnr", True, (_layer("a", 1, 20.0), _layer("b", 2, math.nan)),
                                 reference_value=math.inf)
    assert chart_values(infinite)[0] == [0.0, 0.0]  # relative to the best; NaN draws no bar


# ----- fallback, lint ---------------------------------------------------------------------------

def test_fallback_section_holds_every_evaluation_and_the_kept_layers():
    ranking = ("a", "b", "c")
    plan = search_fallback(ranking, lambda exclude: float(len(exclude)), FallbackTarget.min_metric(2.0))
    verdict, build, section = sections_of(plan)
    assert (verdict.title, build.title) == ("Verdict", "Build") and verdict.lead and build.lead
    assert verdict.paragraphs[0] == ("Target met (metric >= 2): 2 with 2 layer(s) kept out of INT8 (fp16).")
    assert [item.split(":")[0] for item in verdict.items] == list(plan.exclude)
    tables = _tables([section])
    assert tables["fallback-exclude"].rows == tuple((node, ranking.index(node) + 1) for node in plan.exclude)
    assert tables["fallback-evaluations"].rows == tuple(
        (i, e.purpose, len(e.exclude), e.value, e.met, ", ".join(e.exclude))
        for i, e in enumerate(plan.evaluations, 1))
    # value = the number of layers kept out of INT8
    assert all(row[3] == row[2] for row in tables["fallback-evaluations"].rows)
    # No mixed model written yet: placeholder paths, and ModelOpt's exclusion as a flag; the commands
    # lead the report, not repeated in the plan's own section.
    assert build.code[0].splitlines()[1] == plan.commands.trtexec
    assert build.code[0].splitlines()[-1] == "# ModelOpt: --nodes_to_exclude " + " ".join(plan.exclude)
    assert section.code == ()
    assert [p.title for p in section.plots] == ["Fallback search"]


def _lint() -> LintReport:
    findings = (
        Finding("per-tensor-weight", Severity.MEDIUM, 0.0, "one scale", ("conv",), NO_EVIDENCE, "fix it"),
        Finding("no-qdq", Severity.INFO, 0.0, "nothing", ("n",), NO_EVIDENCE, "quantize"))
    return LintReport(findings, "m.onnx")


def test_lint_section_counts_and_lists_findings():
    [section] = sections_of(_lint())
    assert section.paragraphs == ("TensorRT Q/DQ lint of m.onnx: 0 high, 1 medium, 1 info.",)
    [table] = section.tables
    assert table.columns == ("severity", "rule", "node", "finding", "fix")
    assert table.rows == (("medium", "per-tensor-weight", "conv", "one scale", "fix it"),
                          ("info", "no-qdq", "n", "nothing", "quantize"))


# ----- doctor, bundle ---------------------------------------------------------------------------

def _doctor() -> DoctorReport:
    evidence = Evidence(("node",), (("conv",),))
    finding = Finding("weight_zeroing", Severity.HIGH, 0.5, "w zeroed", ("conv",), evidence, "per channel")
    weights = (WeightZeroing("conv", "Conv", "conv.w", 8, 0.5, 0.0, "per-tensor"),)
    stability = (ScaleStability("t", "minmax", 0.5, (4, 8), (0.4, 0.5), (0.3, 0.45), (0.6, 0.55), 0.05, True),
                 ScaleStability("u", "minmax", 1.0, (4, 8), (1.0, 1.0), (0.5, 0.6), (1.5, 1.4), 0.4, False))
    mixed = (MixedRange("y", "output", 1, 0.5, (100.0, 2.0), (0.0, 0.9), (1,), 40.0, 3.0),)
    runs = (CheckRun("weight_zeroing", "fired", "", 0.1), CheckRun("mixed_ranges", "clear", "", 0.2))
    return DoctorReport("m.onnx", 16, 8, (finding,), runs, weights=weights, stability=stability,
                        mixed_ranges=mixed, calibrators=(_comparison("x", 1.5),), lint=_lint())


def test_doctor_sections_put_findings_first_then_what_was_measured():
    sections = sections_of(_doctor())
    assert [(s.title, s.level) for s in sections] == [
        ("Doctor", 2), ("1. [high] weight_zeroing", 3), ("Weights zeroed per node", 3),
        ("Calibrators compared", 3), ("Scale against number of calibration samples", 3),
        ("Value ranges along an axis", 3), ("TensorRT Q/DQ lint", 3)]  # no ranking: the report holds none
    assert sections[0].paragraphs == ("m.onnx: 1 finding(s) (1 high) from 16 calibration and 8 evaluation "
                                      "sample(s).",)
    assert sections[1].paragraphs == ("w zeroed", "Fix: per channel")
    assert sections[1].tables == (Table(("node",), (("conv",),)),)
    tables = _tables(sections)
    assert tables["doctor-findings"].rows == ((1, "high", "weight_zeroing", "w zeroed"),)
    assert tables["doctor-checks"].rows == (("weight_zeroing", "fired", 0.1, ""),
                                            ("mixed_ranges", "clear", 0.2, ""))
    assert tables["weights-zeroed"].rows == (("conv", "Conv", 8, 50.0, 0.0, "per-tensor"),)  # in %
    assert tables["scale-stability"].rows == (("u", "minmax", 1.0, 0.4, False),  # least stable first
                                              ("t", "minmax", 0.5, 0.05, True))
    assert tables["mixed-ranges"].rows == (("y", "output", 1, 0.5, 2, 1, 40.0, 3.0),)
    assert tables["lint-findings"].rows[0][:2] == ("medium", "per-tensor-weight")


def test_swamped_sqnr_shows_only_where_a_channel_is_swamped():
    import math
    from dataclasses import replace

    swamped = MixedRange("y", "output", 1, 0.5, (100.0, 2.0), (0.0, 0.9), (1,), 40.0, 3.0)
    clean = MixedRange("z", "quantized", 1, 0.1, (1.0, 1.0), (0.0, 0.0), (), 50.0, math.nan)
    both = _tables(sections_of(replace(_doctor(), mixed_ranges=(swamped, clean))))["mixed-ranges"]
    assert both.columns[-1] == "swamped SQNR (dB)" and [r[-1] for r in both.rows] == [3.0, None]
    only_clean = _tables(sections_of(replace(_doctor(), mixed_ranges=(clean,))))["mixed-ranges"]
    assert "swamped SQNR (dB)" not in only_clean.columns  # no all-nan column
    assert only_clean.rows == (("z", "quantized", 1, 0.1, 2, 0, 50.0),)


def test_doctor_without_findings_says_so():
    [section] = sections_of(DoctorReport("m.onnx", 4, 4, (), (CheckRun("qdq_fusion", "clear"),)))
    assert section.paragraphs == ("m.onnx: no problems found by the 1 checks.",)


def test_bundle_sections_show_the_summary_then_each_result():
    summary = Evidence(("model", "top-1"), (("FP32", 0.97), ("INT8", 0.96)))
    bundle = ReportBundle("both", (_lint(), _calibration()), summary, ("a note",))
    sections = sections_of(bundle)
    assert [s.title for s in sections] == ["Summary", "TensorRT Q/DQ lint", "Calibration"]
    assert sections[0].paragraphs == ("a note",)
    assert sections[0].tables == (Table(("model", "top-1"), (("FP32", 0.97), ("INT8", 0.96)), "summary"),)
    assert sections_of(ReportBundle("empty", ())) == []


def test_a_bundle_marks_the_excluded_layers_on_the_ranking():
    mpl = pytest.importorskip("matplotlib")  # noqa: F841
    from quantdbg.report.plots import png, ranking_figure

    ranking = _local()
    plan = search_fallback(ranking, lambda exclude: float(len(exclude)), FallbackTarget.min_metric(1.0))
    [ranked, *_] = [s for s in sections_of(ReportBundle("b", (ranking, plan))) if not s.lead]
    values, label = chart_values(ranking)
    assert ranked.plots[0].draw() == png(ranking_figure(["a", "b"], values, label, highlight=plan.exclude))
    assert sections_of(ranking)[0].plots[0].draw() == png(ranking_figure(["a", "b"], values, label))


def test_sections_dispatch_on_the_result_class():
    class Derived(LintReport):
        pass

    assert sections_of(Derived(_lint().findings, "m.onnx")) == sections_of(_lint())
    with pytest.raises(ConfigError, match="Cannot render a dict; pass one of CalibrationResult"):
        sections_of({})


def test_calibration_section_lists_the_folded_weights():
    from dataclasses import replace

    from quantdbg.model.weights import FoldedWeight

    folded = (FoldedWeight("conv", 1, "conv.w", ("Constant",)),
              FoldedWeight("fc", 1, "fc.w", ("Cast",), ("fc.w/fp16",)))
    [section] = sections_of(replace(_calibration(), folded_weights=folded))
    assert section.paragraphs[-1] == (
        "2 weight(s) were not plain initializers (1 in Constant nodes, 1 behind Cast): folded into "
        "initializers. Each is quantized as a weight, per output channel with its own max|w|, and never "
        "calibrated as an activation.")
    table = _tables([section])["folded-weights"]
    assert table.columns == ("node", "input", "tensor", "held as", "done")
    assert table.rows == (("conv", 1, "conv.w", "Constant node", "folded into an initializer"),
                          ("fc", 1, "fc.w", "Cast of initializer 'fc.w/fp16'", "folded into an initializer"))
    [plain] = sections_of(_calibration())
    assert "folded-weights" not in _tables([plain])
