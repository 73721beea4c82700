"""``quantdbg report`` on damaged result files: one line and exit 2, or a rendered report; never a
traceback.

Genuine documents of every kind a report renders are mutated by hypothesis: keys dropped, values
replaced by any JSON value (shallow), by NaN / infinities / negative numbers, lists blown up, values
buried under up to 5,000 levels of nesting (deeper than the codec's limit and than the interpreter's
recursion limit), the text cut short.
"""
from __future__ import annotations

import contextlib
import io
import json
import math
from pathlib import Path

import models_doctor
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from json_docs import json_paths

from quantdbg.cli import main
from quantdbg.config import CalibConfig
from quantdbg.fallback import FallbackTarget
from quantdbg.pipeline import AutoRecipe, AutoResult
from quantdbg.qdq.cache import scales_of

SCALARS = (st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats() | st.text(max_size=6)
           | st.sampled_from(["nan", "inf", "-inf", "high", "isolated", "sqnr"]))
SHALLOW = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=3)
                       | st.dictionaries(st.text(max_size=6), inner, max_size=3), max_leaves=6)
DEPTHS = st.integers(1, 80) | st.integers(900, 5_000)  # around the codec's limit (64), and past recursion
FUZZ = settings(max_examples=40, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                       HealthCheck.data_too_large])


def _auto() -> AutoResult:
    target = FallbackTarget.max_relative_loss(1.0, reference=0.9)
    return AutoResult("int8", target, "accuracy", 0.9, 0.895, 0.895, 0.895, 8, 0,  # type: ignore[arg-type]
                      AutoRecipe(CalibConfig()), {"reference": 1, "int8": 1})


@pytest.fixture(scope="module")
def documents() -> dict[str, dict]:
    results = models_doctor.report_results()
    docs = {kind: result.to_dict() for kind, result in results.items()}
    docs["scales"] = scales_of(results["calibration"]).to_dict()
    docs["auto"] = _auto().to_dict()
    return docs


@st.composite
def damaged(draw, doc: dict) -> str:
    """``doc`` with one to three mutations, as the text ``quantdbg report`` reads."""
    doc = json.loads(json.dumps(doc))
    buried: dict[str, tuple[int, object]] = {}
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from([p for p in json_paths(doc) if p]))
        parent = doc
        for step in path[:-1]:
            parent = parent[step]
        key, old = path[-1], parent[path[-1]]
        action = draw(st.sampled_from(["replace", "delete", "empty", "nonfinite", "huge", "deep"]))
        if action == "delete":
            del parent[key]
        elif action == "empty":
            parent[key] = type(old)() if isinstance(old, (list, dict)) else None
        elif action == "nonfinite":
            parent[key] = draw(st.sampled_from([math.nan, math.inf, -math.inf, "nan", "-inf", -1, 0, 1e308]))
        elif action == "huge":
            parent[key] = [old] * draw(st.integers(100, 2_000)) if not isinstance(old, list) else old * 50
        elif action == "deep":
            # json.dumps cannot write thousands of levels: a marker stands in, replaced in the text.
            marker = f"@@deep{len(buried)}@@"
            buried[marker] = (draw(DEPTHS), old)
            parent[key] = marker
        else:
            parent[key] = draw(SHALLOW)
    text = json.dumps(doc)  # NaN and Infinity become the tokens Python's json reads back
    for marker, (depth, old) in buried.items():
        text = text.replace(json.dumps(marker), "[" * depth + json.dumps(old) + "]" * depth)
    return text[:draw(st.integers(0, len(text)))] if draw(st.integers(0, 9)) == 0 else text


def _report(path: Path, *extra: str) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        status = main(["report", str(path), "--md", str(path.with_suffix(".md")),
                       "--html", str(path.with_suffix(".html")), *extra])
    return status, err.getvalue()


def _check(folder: Path, text: str, *extra: str) -> None:
    path = folder / "result.json"
    for old in folder.iterdir():
        old.unlink()
    path.write_text(text)
    status, err = _report(path, *extra)
    if status == 0:
        assert path.with_suffix(".md").stat().st_size and path.with_suffix(".html").stat().st_size
    else:
        assert status == 2 and err.startswith("quantdbg report: error: ") and err.count("\n") == 1, err
        assert not path.with_suffix(".md").exists() and not path.with_suffix(".html").exists()


KINDS = ["calibration", "scales", "sensitivity", "isolated", "fallback", "lint", "doctor", "auto", "bundle"]


@pytest.mark.parametrize("kind", KINDS)
def test_a_damaged_result_gives_one_line_or_a_report(documents, kind, tmp_path_factory):
    folder = tmp_path_factory.mktemp("report")

    @FUZZ
    @given(damaged(documents[kind]))
    def run(text):
        _check(folder, text, "--no-plots")

    run()


@pytest.mark.parametrize("kind", ["sensitivity", "isolated", "fallback", "doctor", "bundle"])
def test_a_damaged_result_draws_its_plots_or_gives_one_line(documents, kind, tmp_path_factory):
    pytest.importorskip("matplotlib", reason="plots need the [report] extra (matplotlib)")
    folder = tmp_path_factory.mktemp("plots")

    @settings(FUZZ, max_examples=6)
    @given(damaged(documents[kind]))
    def run(text):
        _check(folder, text)

    run()


@example(depth=65)
@example(depth=5_000)
@given(depth=DEPTHS)
@settings(max_examples=10, deadline=None, derandomize=True)
def test_nesting_past_the_limit_is_one_line_at_any_depth(depth, tmp_path_factory):
    folder = tmp_path_factory.mktemp("deep")
    path = folder / "deep.json"
    path.write_text('{"format": "quantdbg.lint/1", "findings": ' + "[" * depth + "]" * depth + "}")
    status, err = _report(path, "--no-plots")
    if depth > 63:  # the findings list sits one level down: 64 levels in all is the limit
        assert status == 2 and err == (f"quantdbg report: error: {str(path)!r}: JSON nested deeper than 64 "
                                       "levels; no quantdbg document is, so this file was not written by "
                                       "quantdbg.\n")
    elif depth == 1:  # "findings": [] -- a lint report without findings
        assert status == 0
    else:  # a list of lists where findings go: refused by the lint report's schema, naming the field
        assert status == 2 and err.count("\n") == 1 and "field 'findings[0]'" in err, err
