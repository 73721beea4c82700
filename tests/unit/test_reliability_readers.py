"""Every reader of a file quantdbg writes raises only the library's own errors on malformed input.

Each genuine document is mutated by hypothesis (a value replaced by any JSON value, a key removed,
a list emptied or the text cut short); the reader must return a result or raise a QuantDbgError.
"""
from __future__ import annotations

import json
from pathlib import Path

import models_sensitivity as ms
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from json_docs import json_paths

from quantdbg._journal import Journal
from quantdbg.backends.tensorrt.inspector import parse_engine_info
from quantdbg.config import CalibConfig
from quantdbg.diagnostics import DoctorConfig, DoctorReport, diagnose
from quantdbg.errors import FormatError, QuantDbgError
from quantdbg.fallback import FallbackPlan, FallbackTarget, auto_fallback
from quantdbg.qdq import quantize
from quantdbg.qdq.cache import read_scales_json, write_scales_json
from quantdbg.report import load_result
from quantdbg.sensitivity import SensitivityConfig, SensitivityReport, VariantEvaluator, analyze_sensitivity
from quantdbg.variants.evaluator import VariantResult

JOURNAL_RUN = {"models": "a", "data": "b", "metric": "c", "mode": "isolated"}
SCALARS = st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats() | st.text(max_size=8)
JSON = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=3)
                    | st.dictionaries(st.text(max_size=6), inner, max_size=3), max_leaves=6)
DEPTHS = st.integers(60, 70) | st.integers(900, 5_000)  # about the codec's limit (64), and past recursion
FUZZ = settings(max_examples=150, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                       HealthCheck.data_too_large])


@pytest.fixture(scope="module")
def documents(tmp_path_factory):
    """Genuine JSON documents of every kind, from the four-layer MLP."""
    folder = tmp_path_factory.mktemp("docs")
    rng = np.random.default_rng(0)
    model = ms.mlp4()
    feeds = ms.feeds_for(model, rng)
    qmodel = ms.quantize_by_hand(model, feeds, {"act1": 0.01})
    report = analyze_sensitivity(model, qmodel, feeds, SensitivityConfig(mode="local"))
    with VariantEvaluator(model, qmodel, feeds, "sqnr") as evaluator:
        plan = auto_fallback(evaluator, FallbackTarget.min_sqnr(30), report=report).plan
    doctor = diagnose(model, {"x": np.concatenate([f["x"] for f in feeds])},
                      config=DoctorConfig(CalibConfig("minmax"),
                                          checks=("sensitive_layers", "weight_zeroing")))
    write_scales_json(quantize(model, feeds, CalibConfig("minmax")), folder / "scales.json")
    journal = Journal.open(folder / "journal", "analyze", JOURNAL_RUN)
    journal.record("evaluation:sweep:isolated:fc0", VariantResult(None, 0.5).to_dict())
    journal.record("evaluation:sweep:isolated:fc1", VariantResult(None, float("inf")).to_dict())
    journal.record("report", report.to_dict())
    lines = [json.loads(line) for line in (folder / "journal").read_text().splitlines()]
    docs = {"sensitivity": report.to_dict(), "plan": plan.to_dict(), "doctor": doctor.to_dict(),
            "journal": lines,
            "scales": json.loads((folder / "scales.json").read_text()),
            "inspector": {"Layers": [{"Name": "conv", "LayerType": "Convolution", "Inputs": [
                {"Name": "x", "Format/Datatype": "Int8"}], "Outputs": [{"Name": "y", "DataType": "Half",
                "Format": "Linear"}], "Metadata": "[ONNX Layer: conv]", "TacticName": "t"}, "names_only"]}}
    return docs


@st.composite
def mutated(draw, doc, lines=False):
    """``doc`` with one to three mutations, as the text a reader sees (``lines``: a list as JSON lines)."""
    doc = json.loads(json.dumps(doc))
    buried: dict[str, tuple[int, object]] = {}
    for _ in range(draw(st.integers(1, 3))):
        paths = list(json_paths(doc))
        path = draw(st.sampled_from(paths))
        action = draw(st.sampled_from(["replace", "replace", "delete", "empty", "deep"]))
        if not path:
            doc = draw(JSON) if action == "replace" else doc
            continue
        parent = doc
        for step in path[:-1]:
            parent = parent[step]
        if action == "delete":
            del parent[path[-1]]
        elif action == "empty":
            old = parent[path[-1]]
            parent[path[-1]] = type(old)() if isinstance(old, (list, dict)) else None
        elif action == "deep":  # a marker json.dumps can write, nested in the text below
            marker = f"@@deep{len(buried)}@@"
            buried[marker] = (draw(DEPTHS), parent[path[-1]])
            parent[path[-1]] = marker
        else:
            parent[path[-1]] = draw(JSON)
    return _bury(_text(doc, lines), buried, draw)


def _text(doc, lines: bool) -> str:
    if lines and isinstance(doc, list):
        return "".join(json.dumps(item) + "\n" for item in doc)
    return json.dumps(doc)


def _bury(text: str, buried: dict[str, tuple[int, object]], draw) -> str:
    """``text`` with each marker replaced by its value nested ``depth`` lists down (json.dumps cannot
    write thousands of levels), then maybe cut short."""
    for marker, (depth, old) in buried.items():
        text = text.replace(json.dumps(marker), "[" * depth + json.dumps(old) + "]" * depth)
    return text[:draw(st.integers(0, len(text)))] if draw(st.integers(0, 9)) == 0 else text


def _fuzz(documents, kind, read, tmp_path_factory):
    folder = tmp_path_factory.mktemp("fuzz")

    @FUZZ
    @given(mutated(documents[kind], lines=kind == "journal"))
    def run(text):
        path = Path(folder) / "f.json"
        path.write_text(text)
        try:
            read(path)
        except QuantDbgError:
            pass  # the only errors a malformed file may give

    run()


READERS = {
    "sensitivity": ("sensitivity", SensitivityReport.read),
    "plan": ("plan", FallbackPlan.read),
    "doctor": ("doctor", DoctorReport.read),
    "load_result": ("doctor", load_result),
    "journal": ("journal", lambda p: Journal.open(p, "analyze", JOURNAL_RUN)),
    "scales": ("scales", read_scales_json),
    "inspector": ("inspector", lambda p: parse_engine_info(p.read_text())),
}


def _plain(value):
    return json.loads(json.dumps(value))


READ_BACK = {
    "sensitivity": lambda got, doc: _plain(got.to_dict()) == _plain(doc),
    "plan": lambda got, doc: _plain(got.to_dict()) == _plain(doc),
    "doctor": lambda got, doc: _plain(got.to_dict()) == _plain(doc),
    "load_result": lambda got, doc: isinstance(got, DoctorReport) and _plain(got.to_dict()) == _plain(doc),
    "journal": lambda got, doc: (_plain([got.get("evaluation:sweep:isolated:fc0"),
                                         got.get("evaluation:sweep:isolated:fc1"), got.get("report")])
                                 == _plain([VariantResult(None, 0.5).to_dict(),
                                            VariantResult(None, float("inf")).to_dict(), doc[-1]["value"]])),
    "scales": lambda got, doc: _plain(got.to_dict()) == _plain(doc),
    "inspector": lambda got, doc: [(layer.name, layer.precision, layer.onnx_nodes) for layer in got] == [
        ("conv", "INT8", ("conv",)), ("names_only", "unknown", ())],
}
"""Reader -> whether what it returned for the genuine document is that document (a reader that
always raised, or returned anything at all, would pass a fuzz test that only counts errors)."""


def _reads_back(documents, reader, folder: Path) -> None:
    kind, read = READERS[reader]
    path = folder / f"{reader.replace(' ', '_')}.json"
    doc = documents[kind]
    path.write_text("".join(json.dumps(x) + "\n" for x in doc) if kind == "journal" else json.dumps(doc))
    assert READ_BACK[reader](read(path), documents[kind]), reader


@pytest.mark.parametrize("reader", list(READERS))
def test_a_mutated_file_raises_only_the_librarys_errors(documents, tmp_path_factory, reader):
    _reads_back(documents, reader, tmp_path_factory.mktemp("genuine"))
    kind, read = READERS[reader]
    _fuzz(documents, kind, read, tmp_path_factory)


@pytest.mark.parametrize("depth", [65, 5_000])
@pytest.mark.parametrize("reader", list(READERS))
def test_a_value_nested_past_the_limit_is_the_librarys_error(documents, tmp_path, reader, depth):
    # the deepest value of the genuine document, buried under ``depth`` lists: past the codec's limit
    # (65) and past the interpreter's recursion limit (5000), where json.loads alone raises RecursionError
    kind, read = READERS[reader]
    doc = json.loads(json.dumps(documents[kind]))
    path = max(json_paths(doc), key=len)
    parent = doc
    for step in path[:-1]:
        parent = parent[step]
    old, parent[path[-1]] = parent[path[-1]], "@@deep@@"
    text = _text(doc, kind == "journal").replace('"@@deep@@"', "[" * depth + json.dumps(old) + "]" * depth)
    (tmp_path / "f.json").write_text(text)
    with pytest.raises(QuantDbgError):
        read(tmp_path / "f.json")


def test_the_genuine_documents_read_back(documents, tmp_path):
    assert set(READ_BACK) == set(READERS)
    for reader in READERS:
        _reads_back(documents, reader, tmp_path)


@pytest.mark.parametrize(("text", "pattern"), [
    ('{"format": "quantdbg.sensitivity/1"}', r"^'.*r\.json': not a valid quantdbg\.sensitivity/1 document: "
                                               r"field 'mode' is missing\."),
    ("1", r"^Resume file '.*r\.json' is not a quantdbg journal"),
])
def test_the_issue_examples_name_file_and_field(tmp_path, text, pattern):
    path = tmp_path / "r.json"
    path.write_text(text)
    reader = SensitivityReport.read if "format" in text else (
        lambda p: Journal.open(p, "analyze", JOURNAL_RUN))
    with pytest.raises(FormatError, match=pattern):
        reader(path)


@pytest.mark.parametrize(("entry", "message"), [
    ({"scale": float("inf")}, "field '(top)': tensor 'act' needs a finite positive 'scale'"),
    ({"scale": True}, "field 'tensors.act.scale': expected a number, got true"),
    ({"scale": 0}, "field '(top)': tensor 'act' needs a finite positive 'scale'"),
    ({"scale": 0.5, "method": 3}, "field 'tensors.act.method': expected a string, got 3"),
])
def test_a_scales_file_with_a_bad_entry_names_the_tensor(tmp_path, entry, message):
    path = tmp_path / "s.json"
    doc = {"format": "quantdbg.scales/1", "tensors": {"act": {"amax": 1.0, "method": None, **entry}}}
    path.write_text(json.dumps(doc).replace("Infinity", "1e999"))
    with pytest.raises(FormatError) as err:
        read_scales_json(path)
    assert str(err.value).startswith(f"{str(path)!r}: not a valid quantdbg.scales/1 document: {message}")
