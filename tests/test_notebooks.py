"""The walkthrough notebook executes (kernel from this interpreter) and shows what it claims."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

nbclient = pytest.importorskip("nbclient", reason="running notebooks needs nbclient (the [dev] extra)")
nbformat = pytest.importorskip("nbformat", reason="running notebooks needs nbformat (the [dev] extra)")
pytest.importorskip("ipykernel", reason="running notebooks needs ipykernel (the [dev] extra)")
pytest.importorskip("pandas", reason="the walkthrough's tables need the [report] extra (pandas)")
pytest.importorskip("matplotlib", reason="the walkthrough's plots need the [report] extra (matplotlib)")

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "walkthrough.ipynb"


@pytest.fixture(scope="module")
def executed(tmp_path_factory):
    nb = nbformat.read(NOTEBOOK, as_version=4)
    cwd = tmp_path_factory.mktemp("nb")
    # "python3" is ipykernel's native kernel: it runs on the interpreter running the tests.
    nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": str(cwd)}}).execute()
    assert list(cwd.iterdir()) == []  # the notebook writes nothing outside its temporary folder
    return nb


def _outputs(nb, kind: str) -> list:
    return [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == kind]


def test_notebook_runs_without_errors_and_its_summary_holds(executed):
    assert _outputs(executed, "error") == []
    summary = json.loads(executed.cells[-1].outputs[-1].text)
    assert summary["fp32_top1"] >= 0.97
    for method, top1 in summary["int8_top1"].items():
        assert abs(top1 - summary["fp32_top1"]) <= 0.005, method  # INT8 within 0.5 points
    assert set(summary["int8_top1"]) == {"minmax", "entropy", "percentile", "mse"}
    assert sorted(summary["isolated_ranking"]) == sorted(summary["local_ranking"])
    assert len(summary["isolated_ranking"]) == 8
    assert summary["fallback_status"] == "met"
    assert summary["fallback_exclude"][0] == summary["isolated_ranking"][0]
    assert summary["mixed_sqnr_db"] >= 42.0 > summary["int8_sqnr_db"]["entropy"]
    assert summary["mixed_top1"] >= summary["fp32_top1"] - 0.005
    assert set(summary["doctor_checks"].values()) <= {"fired", "clear"}
    assert summary["html_bytes"] > 50_000
    assert not math.isnan(summary["mixed_sqnr_db"])


def test_notebook_displays_the_reports_inline(executed):
    shown = _outputs(executed, "display_data") + _outputs(executed, "execute_result")
    html = [o.data["text/html"] for o in shown if "text/html" in o.data]
    joined = "\n".join(html)
    for table in ("calibration-ranges", "calibrator-comparison", "sensitivity-ranking",
                  "fallback-evaluations", "doctor-findings", "summary"):
        assert f'id="{table}"' in joined, table
    assert joined.count('<img src="data:image/png;base64,') >= 4
    printed = "".join(o.text for o in _outputs(executed, "stream"))
    assert "quantdbg doctor:" in printed and "kept out of INT8: ['" in printed
    # The plan leads with its verdict and build commands; results print as one line each.
    assert joined.count('<h2>Verdict</h2>') >= 2  # the plan alone, then the bundle
    assert "FallbackResult(status='met'" in printed and "QuantizedModel(8 quantized layers" in printed
    assert "--layerPrecisions=" in printed and "polygraphy convert" in printed


def _summary(nb) -> dict:
    return json.loads(nb.cells[-1].outputs[-1].text)


def test_the_committed_notebook_is_executed_and_current(executed):
    committed = nbformat.read(NOTEBOOK, as_version=4)
    code = [c for c in committed.cells if c.cell_type == "code"]
    assert [c.execution_count for c in code] == list(range(1, len(code) + 1))  # run top to bottom
    assert all(c.outputs for c in code)
    assert not any(o.output_type == "error" for c in code for o in c.outputs)
    # Re-running it gives the numbers it shows (the report's size moves with its timings).
    before, after = _summary(committed), _summary(executed)
    before.pop("html_bytes"), after.pop("html_bytes")
    assert before == after
