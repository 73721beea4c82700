"""One source per fact: each number a report states in two places (the verdict, a table, a plot's axis)
is the same number, in the same unit. The reports are rendered (HTML and Markdown) and the facts
compared between their sections."""
from __future__ import annotations

import html
import math
import re

import models_doctor
import models_sensitivity as ms
import numpy as np
import pytest

from quantdbg import report
from quantdbg.fallback import FallbackTarget, auto_fallback, search_fallback
from quantdbg.report import ReportBundle
from quantdbg.report.sections import fallback as fallback_section
from quantdbg.report.sections.registry import sections_of
from quantdbg.sensitivity import LayerEvidence, LayerSensitivity, SensitivityReport, VariantEvaluator
from quantdbg.sensitivity.report import QuantizedInput


def _layer(node: str, rank: int, value: float, evidence: bool) -> LayerSensitivity:
    inputs = (QuantizedInput(0, f"{node}.in", "activation", "entropy", 0.02, 0.02, 1),)
    ev = LayerEvidence(weight_zero_fraction=0.03, calibrator_sqnr={"entropy": 30.0, "mse": 31.0},
                       recorded_sqnr=30.0, best_calibrator="mse") if evidence else None
    return LayerSensitivity(node, "Conv", inputs, rank, -value, value, evidence=ev)


# The search walks the isolated ranking; the local ranking (which has the evidence) orders the layers
# differently, as in a bundle of an isolated analysis and a doctor report.
ISOLATED = SensitivityReport("isolated", "sqnr", True, (
    _layer("conv2", 1, 36.0, False), _layer("fc2", 2, 44.8, False), _layer("stem", 3, 48.0, False)))
LOCAL = SensitivityReport("local", "sqnr (dB)", True, (
    _layer("conv2", 1, 28.3, True), _layer("stem", 2, 40.0, True), _layer("fc2", 3, 44.8, True)))


def _plan():
    gains = {"conv2": 6.0, "fc2": 2.0, "stem": 0.5}  # additive SQNR model from 35 dB
    target = FallbackTarget.min_sqnr(42.0)
    return search_fallback(ISOLATED, lambda ex: 35.0 + sum(gains[n] for n in ex), target)


def _md_table(text: str, first_column: str) -> tuple[list[str], list[list[str]]]:
    """The Markdown table whose header starts with ``| first_column |``."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"| {first_column} |"))
    header = [c.strip() for c in lines[start].strip("|").split(" | ")]
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip("|").split(" | ")])
    return header, rows


def _html_table(page: str, css_id: str) -> tuple[list[str], list[list[str]]]:
    body = re.search(rf'<table id="{css_id}">(.*?)</table>', page, re.S)
    assert body, css_id
    header = [html.unescape(h) for h in re.findall(r"<th>(.*?)</th>", body.group(1), re.S)]
    rows = [[html.unescape(re.sub(r"<[^>]+>", "", c)) for c in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)]
            for row in re.findall(r"<tr>(.*?)</tr>", body.group(1), re.S)]
    return header, [r for r in rows if r]


def test_the_verdict_gives_each_layer_the_rank_the_plans_table_gives():
    bundle = ReportBundle("b", (LOCAL, ISOLATED, _plan()))
    markdown = report.render_markdown(bundle)
    verdict = dict(re.findall(r"^- (\w+): rank (\d+) of \d+", markdown, re.M))
    _, rows = _md_table(markdown, "node | rank")
    assert verdict == {node: rank for node, rank in rows} == {"conv2": "1", "fc2": "2"}
    page = report.render_html(bundle, plots=False)
    in_html = dict(re.findall(r"<strong>(\w+)</strong>: rank (\d+) of \d+", page))
    _, rows = _html_table(page, "fallback-exclude")
    assert in_html == {node: rank for node, rank in rows} == verdict


def test_the_number_measured_with_a_layer_back_in_int8_is_the_evaluation_in_the_table():
    plan = _plan()
    markdown = report.render_markdown(ReportBundle("b", (ISOLATED, plan)))
    header, rows = _md_table(markdown, "# | purpose")
    value = header.index("output SQNR (dB)")
    by_set = {row[-1]: row[value] for row in rows}
    for node in plan.exclude:
        rest = ", ".join(n for n in plan.exclude if n != node)
        line = next(line for line in markdown.splitlines() if line.startswith(f"- {node}:"))
        said = re.search(r"with this layer back in INT8 \((.*?) still out\) the search measured ([\d.]+) dB",
                         line)
        assert said and said.group(1) == rest and said.group(2) == by_set[rest], line


@pytest.fixture(scope="module")
def sqnr_as_metric():
    """A plan searched with a metric target on the output SQNR (``fallback --min-metric`` with the
    default metric): its values are dB though the target is not an SQNR target."""
    rng = np.random.default_rng(0)
    model = ms.mlp4()
    feeds = ms.feeds_for(model, rng)
    qmodel = ms.quantize_by_hand(model, feeds, {"act1": 0.05, "act2": 0.05})
    with VariantEvaluator(model, qmodel, feeds, "sqnr") as evaluator:
        return auto_fallback(evaluator, FallbackTarget.min_metric(30.0)).plan


def test_the_fallback_axis_and_table_name_the_metric_with_its_unit(sqnr_as_metric, monkeypatch):
    plan = sqnr_as_metric
    assert plan.target.kind == "metric" and plan.metric == "sqnr"
    drawn = {}

    def capture(sizes, values, met, threshold, ylabel):
        drawn.update(values=list(values), ylabel=ylabel)
        raise RuntimeError("not drawn")

    monkeypatch.setattr(fallback_section, "fallback_figure", capture)
    [plot] = next(s for s in sections_of(plan) if s.title == "Fallback plan").plots
    with pytest.raises(RuntimeError, match="not drawn"):
        plot.draw()
    header, rows = _md_table(report.render_markdown(plan), "# | purpose")
    column = header.index(drawn["ylabel"])  # the axis and the table column carry one label ...
    assert drawn["ylabel"] == "output SQNR (dB)"  # ... with the unit of the values
    assert [float(r[column]) for r in rows] == pytest.approx(drawn["values"], rel=1e-3)
    verdict = report.render_markdown(plan).split("## Verdict", 1)[1]
    assert re.search(rf"{plan.value:.4g} dB with", verdict), verdict[:200]


@pytest.fixture(scope="module")
def results():
    return models_doctor.report_results()


@pytest.mark.parametrize("kind", ["sensitivity", "isolated", "doctor"])
def test_no_ranking_column_repeats_another(results, kind):
    tables = [t for s in sections_of(results[kind]) for t in s.tables
              if t.css_id in ("sensitivity-ranking", "sensitivity-agreement")]
    assert tables
    for table in tables:
        numeric = {c: [row[i] for row in table.rows] for i, c in enumerate(table.columns)
                   if c not in ("rank", "fused rank")
                   and all(isinstance(row[i], float) for row in table.rows)}
        for a in numeric:
            for b in numeric:
                if a < b:
                    same = all(x == y or x == -y or (math.isnan(x) and math.isnan(y))
                               for x, y in zip(numeric[a], numeric[b], strict=True))
                    assert not same, (table.css_id, a, b)
        assert "value" not in table.columns and "score" not in table.columns  # named with their unit


def test_zeroed_weights_are_percent_in_every_table_as_on_the_plot(results):
    doctor = results["doctor"]
    page = report.render_html(doctor, plots=False)
    header, rows = _html_table(page, "weights-zeroed")
    tensor, channel = header.index("zeroed per-tensor (%)"), header.index("zeroed per-channel (%)")
    for row, measured in zip(rows, doctor.weights, strict=True):
        assert float(row[tensor]) == pytest.approx(100 * measured.per_tensor, rel=1e-3, abs=1e-9)
        assert float(row[channel]) == pytest.approx(100 * measured.per_channel, rel=1e-3, abs=1e-9)
    ranking_header, ranking_rows = _html_table(page, "sensitivity-ranking")
    zeroed = ranking_header.index("weights zeroed in use (%)")
    by_node = {w.node: w.actual for w in doctor.weights}
    for row in ranking_rows:
        if row[1] in by_node and row[zeroed] != "-":
            assert float(row[zeroed]) == pytest.approx(100 * by_node[row[1]], rel=1e-3, abs=1e-9)


def test_slices_along_an_axis_are_not_called_channels(results):
    doctor = results["doctor"]
    assert any(m.axis != 1 for m in doctor.mixed_ranges)  # a width (last) axis is examined too
    markdown = report.render_markdown(doctor)
    header, rows = _md_table(markdown, "tensor | role | axis")
    assert not [c for c in header if "channel" in c]
    count = header.index("slices along the axis")
    assert [int(r[count]) for r in rows] == [len(m.channel_absmax) for m in doctor.mixed_ranges]
    assert "## Value ranges per channel" not in markdown and "### Value ranges along an axis" in markdown
