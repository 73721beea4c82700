"""``quantdbg report``, ``quantdbg doctor`` and ``quantdbg demo`` on the command line."""
from __future__ import annotations

import json
import re
from pathlib import Path

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


README = Path(__file__).resolve().parents[2] / "README.md"
_NUMBER = re.compile(r"\d+(?:\.\d+)?")


def _readme_demo_output() -> tuple[list[str], str]:
    """The printout README.md shows under "`quantdbg demo` is", and the folder it names."""
    block = re.search(r"^`quantdbg demo` is .*?^```\n(.*?)^```", README.read_text(), re.S | re.M).group(1)
    folder = re.search(r"^report: (.*)/report\.html$", block, re.M).group(1)
    return block.splitlines(), folder


def _pattern(line: str, sample_folder: str, folder: str) -> re.Pattern[str]:
    """``line`` as a pattern: its numbers any numbers, its runs of spaces any runs, its folder ``folder``."""
    def literal(text: str) -> str:
        parts = [re.escape(part) for part in _NUMBER.split(text)]
        return r"\d+(?:\.\d+)?".join(parts).replace(r"\ ", " ")

    pieces = [re.sub(" +", " +", literal(part)) for part in line.split(sample_folder)]
    return re.compile(re.escape(folder).join(pieces))


def test_demo_prints_what_the_readme_shows(tmp_path, capsys):
    pytest.importorskip("matplotlib", reason="the demo's HTML report needs the [report] extra (matplotlib)")
    out = tmp_path / "new" / "demo"
    assert main(["demo", "--out", str(out), "--threads", "1", "--no-progress"]) == 0
    printed = capsys.readouterr().out.splitlines()
    shown, sample_folder = _readme_demo_output()
    assert len(printed) == len(shown), "\n".join(printed)
    for got, line in zip(printed, shown, strict=True):
        assert _pattern(line, sample_folder, str(out)).fullmatch(got), f"README: {line}\nprinted: {got}"
    final = re.search(r"^final\s+(\d)/8\s+\d+\.\d\d%\s+(\d+\.\d) dB$", "\n".join(printed), re.M)
    assert final and float(final.group(2)) >= 42.0
    kept = re.search(r"kept out of INT8 by the fallback search: (.*)$", "\n".join(printed), re.M).group(1)
    result = json.loads((out / "plan.json").read_text())
    assert result["met"] and result["exclude"] == kept.split(", ")
    assert int(final.group(1)) == 8 - len(result["exclude"])


def test_the_readme_pattern_tells_numbers_from_words():
    pattern = _pattern("final   7/8   99.26%   42.5 dB in /tmp/x1/r", "/tmp/x1", "/work/o 2")
    assert pattern.fullmatch("final  6/8  100.00%  41.25 dB in /work/o 2/r")
    assert not pattern.fullmatch("mixed  6/8  100.00%  41.25 dB in /work/o 2/r")
    assert not pattern.fullmatch("final  6/8  100.00%  41.25 dB in /tmp/x1/r")
