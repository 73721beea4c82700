"""``quantdbg report``, ``quantdbg doctor`` and ``quantdbg demo`` on the command line."""
from __future__ import annotations

import json
import re

import models_doctor
import numpy as np
import onnx
import pytest

from quantdbg.cli import main
from quantdbg.diagnostics import DoctorReport
from quantdbg.report import write_report


@pytest.fixture
def conv_files(tmp_path, rng):
    model = tmp_path / "conv.onnx"
    onnx.save(models_doctor.outlier_channel_conv(), str(model))
    data = tmp_path / "calib.npz"
    np.savez(data, x=rng.standard_normal((16, 3, 8, 8), dtype=np.float32))
    return model, data


def test_report_renders_html_and_markdown(tmp_path, capsys):
    pytest.importorskip("matplotlib", reason="the HTML report's plots need the [report] extra (matplotlib)")
    plan_json = tmp_path / "plan.json"
    from quantdbg.fallback import FallbackTarget, search_fallback

    plan = search_fallback(["a", "b", "c"], lambda exclude: float(len(exclude)),
                           FallbackTarget.min_metric(2.0))
    write_report(plan, json=plan_json)
    html, md = tmp_path / "r.html", tmp_path / "r.md"
    status = main(["report", str(plan_json), "--html", str(html), "--md", str(md)])
    assert status == 0
    assert capsys.readouterr().out == f"wrote {tmp_path / 'r.html'}, {tmp_path / 'r.md'}\n"
    assert 'id="fallback-evaluations"' in (tmp_path / "r.html").read_text()
    assert "| node | rank |" in (tmp_path / "r.md").read_text()
    # --md - prints the same Markdown (as lint's and doctor's --md - do) and writes nothing else
    assert main(["report", str(plan_json), "--md", "-"]) == 0
    assert capsys.readouterr().out == (tmp_path / "r.md").read_text()


def _md_table(text: str, header: str) -> list[list[str]]:
    lines = text.splitlines()
    start = lines.index(header)
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split(" | ")])
    return rows


@pytest.mark.parametrize("untagged", [False, True])
def test_report_renders_the_scales_file_calibrate_wrote(conv_files, tmp_path, capsys, untagged):
    model, data = conv_files
    scales = tmp_path / "scales.json"
    assert main(["calibrate", str(model), "--data", str(data), "--out", str(tmp_path / "q.onnx"),
                 "--method", "minmax", "--scales", str(scales), "--no-progress"]) == 0
    written = json.loads(scales.read_text())
    if untagged:  # as quantdbg 0.1.0 wrote it
        scales.write_text(json.dumps(written["tensors"]))
    capsys.readouterr()
    assert main(["report", str(scales), "--md", "-"]) == 0
    text = capsys.readouterr().out
    rows = _md_table(text, "| tensor | calibrator | amax | scale |")
    assert [r[0] for r in rows] == list(written["tensors"])
    for name, method, amax, scale in rows:
        entry = written["tensors"][name]
        assert method == entry["method"] == "minmax"
        assert float(amax) == pytest.approx(entry["amax"], rel=1e-3)  # shown to 4 significant digits
        assert float(scale) == pytest.approx(entry["scale"], rel=1e-3)
    assert f"Scales of {len(rows)} activation tensor(s)" in text


def test_report_errors_are_one_line_with_status_2(tmp_path, capsys):
    assert main(["report", str(tmp_path / "none.json"), "--html", str(tmp_path / "r.html")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("quantdbg report: error: Cannot read '") and err.count("\n") == 1
    (tmp_path / "x.json").write_text("{}")
    assert main(["report", str(tmp_path / "x.json")]) == 2
    assert ("Nothing to write: give --html OUT.html and/or --md OUT.md (--md -: print it)."
            in capsys.readouterr().err)
    assert main(["report", str(tmp_path / "x.json"), "--html", str(tmp_path / "no" / "r.html")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert not (tmp_path / "r.html").exists()


def test_doctor_prints_findings_and_writes_what_was_asked(conv_files, tmp_path, capsys):
    model, data = conv_files
    out = tmp_path / "doctor.json"
    status = main(["doctor", str(model), "--data", str(data), "--json", str(out), "--no-progress",
                   "--checks", "weight_zeroing", "qdq_fusion", "mixed_ranges"])
    assert status == 0
    text = capsys.readouterr().out
    report = DoctorReport.read(out)
    assert text.startswith(f"quantdbg doctor: {model} (16 calibration samples")
    numbered = re.findall(r"^(\d+)\. \[(\w+)\] (\w+): (.*)$", text, re.M)
    assert [(s.lower(), c, t) for _, s, c, t in numbered] == [(f.severity, f.check, f.title)
                                                               for f in report.findings]
    assert text.rstrip().endswith(f"wrote {out}")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["calib.npz", "conv.onnx", "doctor.json"]


def test_doctor_fail_on_sets_the_exit_status(conv_files, capsys):
    model, data = conv_files
    args = ["doctor", str(model), "--data", str(data), "--no-progress", "--checks", "weight_zeroing"]
    assert main(args + ["--fail-on", "info"]) == 1  # per-channel weights: an info finding only
    assert main(args + ["--fail-on", "medium"]) == 0
    capsys.readouterr()


def test_doctor_bad_input_is_one_line(conv_files, tmp_path, capsys):
    model, _ = conv_files
    bad = tmp_path / "bad.npz"
    np.savez(bad, y=np.zeros((2, 3, 8, 8), np.float32))
    assert main(["doctor", str(model), "--data", str(bad), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("quantdbg doctor: error:") and "'x'" in err and err.count("\n") == 1


def test_demo_rejects_bad_threads(capsys):
    assert main(["demo", "--threads", "-1"]) == 2
    assert "--threads must be >= 0, got -1." in capsys.readouterr().err


def test_demo_prints_the_table_and_the_report_path(tmp_path, capsys):
    pytest.importorskip("matplotlib", reason="the demo's HTML report needs the [report] extra (matplotlib)")
    out = tmp_path / "new" / "demo"
    assert main(["demo", "--out", str(out), "--threads", "1", "--no-progress"]) == 0
    text = capsys.readouterr().out
    assert re.search(r"^FP32\s+0/8\s+\d+\.\d\d%\s+-$", text, re.M)
    assert re.search(r"^INT8\s+8/8\s+\d+\.\d\d%\s+\d+\.\d dB$", text, re.M)
    mixed = re.search(r"^mixed\s+(\d)/8\s+\d+\.\d\d%\s+(\d+\.\d) dB$", text, re.M)
    assert mixed and float(mixed.group(2)) >= 42.0
    assert f"report: {out / 'report.html'}" in text
    kept = re.search(r"kept out of INT8 by the fallback search: (.*)$", text, re.M).group(1).split(", ")
    assert 8 - len(kept) == int(mixed.group(1))
    plan = json.loads((out / "fallback_plan.json").read_text())
    assert plan["exclude"] == kept and plan["status"] == "met"
