"""Reports: every result kind renders to self-contained HTML, Markdown and JSON that reads back.

Section contents are tested in test_report_sections.py, the figures in test_report_plots.py."""
from __future__ import annotations

import base64
import html as html_mod
import json
import math
import re
import subprocess
import sys

import models_doctor
import pytest

from quantdbg import _json, report
from quantdbg.diagnostics import Evidence
from quantdbg.errors import ConfigError, FormatError
from quantdbg.report import ReportBundle
from quantdbg.report.results import render_json
from quantdbg.report.sections.registry import sections_of
from quantdbg.report.sections.sensitivity import chart_values

KINDS = ("calibration", "sensitivity", "fallback", "lint", "doctor", "bundle")
PRIMARY = {"calibration": "calibration-ranges", "sensitivity": "sensitivity-ranking",
           "fallback": "fallback-evaluations", "lint": "lint-findings", "doctor": "doctor-findings"}


@pytest.fixture(scope="module")
def results():
    return models_doctor.report_results()


def _images(page: str) -> list[bytes]:
    found = re.findall(r'<img src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)
    return [base64.b64decode(m) for m in found]


def _table(page: str, css_id: str) -> str:
    match = re.search(rf'<table id="{css_id}">(.*?)</table>', page, re.S)
    assert match, f"no table {css_id!r}"
    return match.group(1)


@pytest.mark.parametrize("kind", KINDS)
def test_json_round_trip_through_a_file(results, kind, tmp_path):
    result = results[kind]
    written = report.write_report(result, json=tmp_path / "r.json")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json"]  # nothing else is written
    again = report.load_result(written.json)
    assert type(again) is type(result)
    assert json.loads(render_json(again)) == json.loads(render_json(result))


@pytest.mark.parametrize("kind", KINDS)
def test_every_result_file_carries_its_format_tag(results, kind):
    data = results[kind].to_dict()
    assert data["format"] == _json.format_of(type(results[kind]))
    name = {"fallback": "fallback_plan", "bundle": "report"}.get(kind, kind)
    assert data["format"].startswith(f"quantdbg.{name}/")


@pytest.mark.parametrize("kind", ["calibration", "lint"])
def test_an_untagged_result_of_the_previous_version_still_renders(results, kind, tmp_path):
    # quantdbg 0.1.0 wrote calibration results and lint reports without a tag; the codec recognises them.
    data = results[kind].to_dict()
    del data["format"]
    (tmp_path / "old.json").write_text(json.dumps(data))
    again = report.load_result(tmp_path / "old.json")
    assert again.to_dict() == results[kind].to_dict()
    assert report.render_markdown(again) == report.render_markdown(results[kind])


def test_html_is_self_contained_with_decodable_plots(results):
    pytest.importorskip("matplotlib")
    page = report.render_html(results["bundle"])
    assert "Content-Security-Policy" in page and "default-src 'none'" in page
    assert "<script" not in page
    assert not re.search(r'(src|href)="(?!data:|#)', page)  # no external resource or link
    images = _images(page)
    # ranking, fallback search; the doctor's ranking, weights zeroed, histograms, scale curves
    assert len(images) == 6
    assert all(img.startswith(b"\x89PNG\r\n\x1a\n") for img in images)


def test_sensitivity_table_lists_every_layer_in_rank_order(results):
    sensitivity = results["sensitivity"]
    table = _table(report.render_html(sensitivity, plots=False), "sensitivity-ranking")
    rows = re.findall(r"<tr>(.*?)</tr>", table, re.S)[1:]
    nodes = [html_mod.unescape(re.findall(r"<td>(.*?)</td>", row)[0]) for row in rows]
    assert nodes == list(sensitivity.ranking)


@pytest.mark.parametrize("kind", [k for k in KINDS if k != "bundle"])
def test_markdown_has_the_primary_table_with_every_row(results, kind):
    pytest.importorskip("pandas")
    result = results[kind]
    text = report.render_markdown(result)
    frame_rows = len(report.to_dataframe(result))
    header = next(t for s in sections_of(result) for t in s.tables if t.css_id == PRIMARY[kind])
    line = "| " + " | ".join(header.columns) + " |"
    lines = text.splitlines()
    start = lines.index(line)
    body = [x for x in lines[start + 2:start + 2 + frame_rows + 1] if x.startswith("|")]
    assert len(body) == frame_rows
    assert "<img" not in text and "base64" not in text


def test_dataframe_holds_raw_values(results):
    pytest.importorskip("pandas")
    sensitivity = results["sensitivity"]
    frame = report.to_dataframe(sensitivity)
    assert list(frame["node"]) == list(sensitivity.ranking)
    own = list(frame["SQNR of its own output (dB)"])  # local mode: the value, shown once
    assert own == pytest.approx([layer.value for layer in sensitivity.layers])
    calibration = results["calibration"]
    frame = report.to_dataframe(calibration)
    assert list(frame["tensor"]) == list(calibration.ranges)
    assert list(frame["scale"]) == [r.scale for r in calibration.ranges.values()]


def test_dataframe_without_pandas_names_the_extra():
    code = ("import sys; sys.modules['pandas'] = None\n"
            "from quantdbg import report\n"
            "from quantdbg.errors import MissingDependencyError\n"
            "try:\n    report.to_dataframe(object())\nexcept MissingDependencyError as e:\n    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "quantdbg[report]" in out


def test_html_without_matplotlib_needs_the_extra_unless_plots_are_off(results, tmp_path):
    path = tmp_path / "fallback.json"
    report.write_report(results["fallback"], json=path)
    code = ("import sys; sys.modules['matplotlib'] = None\n"
            "from quantdbg import report\n"
            "from quantdbg.errors import MissingDependencyError\n"
            f"r = report.load_result({str(path)!r})\n"
            "assert 'Plots omitted' in report.render_html(r, plots=False)\n"
            "try:\n    report.render_html(r)\nexcept MissingDependencyError as e:\n    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "quantdbg[report]" in out


def test_names_are_escaped(results):
    evil = Evidence(("node",), (("<script>alert(1)</script>",),))
    page = report.render_html(ReportBundle("<b>t</b>", (results["lint"],), evil), plots=False)
    assert "<script>" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "<title>&lt;b&gt;t&lt;/b&gt;</title>" in page


def test_repr_html_hooks_render_fragments(results):
    fragment = results["doctor"]._repr_html_()
    assert fragment.startswith('<div class="quantdbg-report">') and "<html" not in fragment
    assert 'id="doctor-findings"' in fragment
    assert 'id="summary"' not in results["bundle"]._repr_html_()  # no summary table given


def test_unknown_results_and_json_are_refused(tmp_path):
    with pytest.raises(ConfigError, match="Cannot render a dict; pass one of CalibrationResult"):
        report.render_html({})
    bad = tmp_path / "x.json"
    bad.write_text('{"hello": 1}')
    with pytest.raises(FormatError, match=r"x.json': not a quantdbg document \(no 'format' tag\); known: .*"
                                          r"A report renders a calibration result"):
        report.load_result(bad)
    bad.write_text("[1, 2]")
    with pytest.raises(FormatError, match="a JSON list, not an object"):
        report.load_result(bad)
    bad.write_text('{"format": "quantdbg.auto_recipe/1"}')
    with pytest.raises(ConfigError, match=r"x.json' is a quantdbg.auto_recipe/1 document, which is not a "
                                          "result a report renders"):
        report.load_result(bad)
    with pytest.raises(ConfigError, match="needs at least one of html=, markdown= or json="):
        report.write_report(ReportBundle("t", ()))
    with pytest.raises(ConfigError, match="folder .* does not exist"):
        report.write_report(ReportBundle("t", ()), json=tmp_path / "missing" / "r.json")


def test_bundles_do_not_nest():
    with pytest.raises(ConfigError, match="cannot hold another bundle"):
        ReportBundle("outer", (ReportBundle("inner", ()),))


def test_section_anchors_are_unique_in_a_bundle(results):
    page = report.render_html(ReportBundle("twice", (results["calibration"], results["calibration"])),
                              plots=False)
    ids = re.findall(r'<section id="([^"]+)"', page)
    assert len(ids) == len(set(ids)) and "calibration-2" in ids
    tables = re.findall(r'<table id="([^"]+)"', page)
    assert len(tables) == len(set(tables)) and "calibration-ranges-2" in tables


def test_bundle_json_keeps_its_format_and_kinds(results):
    bundle = results["bundle"]
    data = bundle.to_dict()
    assert list(data) == ["format", "title", "summary", "notes", "results"]
    assert data["format"] == "quantdbg.report/1"
    kinds = ["calibration", "sensitivity", "fallback", "lint", "doctor"]
    assert [m["kind"] for m in data["results"]] == kinds
    assert [m["data"] for m in data["results"]] == [r.to_dict() for r in bundle.results]
    with pytest.raises(FormatError, match="format is 'quantdbg.doctor/1', expected 'quantdbg.report/1'"):
        ReportBundle.from_dict(results["doctor"].to_dict())


def test_a_plain_calibration_renders_what_it_holds_and_nothing_more(results):
    page = report.render_html(results["calibration"], plots=False)
    assert 'id="calibration-ranges"' in page
    assert "Calibrators compared" not in page and 'id="calibrator-comparison"' not in page
    assert 'id="calibrator-comparison"' in report.render_html(results["doctor"], plots=False)


def test_ranking_chart_values(results):
    local = results["sensitivity"]
    values, label = chart_values(local)
    best = max(layer.value for layer in local.layers)
    assert values == pytest.approx([best - layer.value for layer in local.layers])
    assert "quietest" in label
    isolated = results["isolated"]  # SQNR: FP32 reference is infinite, so bars are relative
    assert math.isinf(isolated.reference_value)
    values, _ = chart_values(isolated)
    assert min(values) == 0.0 and all(v >= 0 for v in values)
