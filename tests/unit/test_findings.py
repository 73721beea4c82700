"""The language lint and doctor share: severities, findings, evidence tables and cell formatting."""
from __future__ import annotations

import json
import math

import pytest

from quantdbg.diagnostics import Evidence, Finding, Severity
from quantdbg.diagnostics.findings import (
    FAIL_ON,
    NO_EVIDENCE,
    fail_threshold,
    format_cell,
    markdown_cell,
    reaches,
    severity_counts,
)
from quantdbg.errors import ConfigError, FormatError


def _finding(severity: Severity, check: str = "weight_zeroing") -> Finding:
    return Finding(check, severity, 1.0, "title", ("n",), NO_EVIDENCE, "fix")


def test_severities_rank_high_to_info():
    assert [s.value for s in Severity] == ["high", "medium", "low", "info"]
    assert [s.rank for s in Severity] == [3, 2, 1, 0]


@pytest.mark.parametrize("word, severity", [("high", Severity.HIGH), ("error", Severity.HIGH),
                                            ("medium", Severity.MEDIUM), ("warning", Severity.MEDIUM),
                                            ("low", Severity.LOW), ("info", Severity.INFO),
                                            (Severity.LOW, Severity.LOW)])
def test_parse_reads_the_scale_and_lints_former_words(word, severity):
    assert Severity.parse(word) is severity
    assert fail_threshold(word) is severity


def test_parse_rejects_unknown_words_and_never_means_no_threshold():
    with pytest.raises(ConfigError, match="Unknown severity 'fatal'; choose one of high, medium, low, info, "
                                          "error, warning."):
        Severity.parse("fatal")
    with pytest.raises(ConfigError, match="Unknown severity 'never'"):
        Severity.parse("never")  # a threshold word, not a severity
    assert fail_threshold("never") is None
    assert FAIL_ON == ("high", "medium", "low", "info", "error", "warning", "never")


@pytest.mark.parametrize("fail_on, expected", [("high", False), ("error", False), ("medium", True),
                                               ("warning", True), ("info", True), ("never", False)])
def test_reaches_compares_with_the_threshold(fail_on, expected):
    assert reaches([_finding(Severity.MEDIUM), _finding(Severity.INFO)], fail_on) is expected


def test_counts_keep_every_severity_asked_for_in_scale_order():
    found = [_finding(Severity.INFO), _finding(Severity.HIGH), _finding(Severity.INFO)]
    assert severity_counts(found) == {"high": 1, "medium": 0, "low": 0, "info": 2}
    assert severity_counts(found, (Severity.HIGH, Severity.INFO)) == {"high": 1, "info": 2}


@pytest.mark.parametrize("value, text", [(None, "-"), (True, "yes"), (False, "no"), (3, "3"),
                                         (0.123456, "0.1235"), (12345.678, "1.235e+04"), (math.inf, "inf"),
                                         (-math.inf, "-inf"), (math.nan, "nan"), ("a|b\nc", "a|b\nc")])
def test_format_cell(value, text):
    assert format_cell(value) == text


def test_markdown_cell_escapes_pipes_and_newlines():
    assert markdown_cell("a|b\nc") == "a\\|b c"
    assert markdown_cell(0.5) == "0.5"


def test_evidence_round_trips_every_kind_of_cell():
    rows = ((1, 2.5, True, "x", None), (math.inf, -math.inf, False, "", 0))
    evidence = Evidence(("a", "b", "c", "d", "e"), rows)
    data = json.loads(json.dumps(evidence.to_dict(), allow_nan=False))  # strict JSON: infinities as strings
    assert data["rows"][1][:2] == ["inf", "-inf"]
    again = Evidence.from_dict(data)
    assert again == evidence
    assert [type(v) for v in again.rows[0]] == [int, float, bool, str, type(None)]
    nan = Evidence.from_dict(Evidence(("x",), ((math.nan,),)).to_dict())
    assert math.isnan(nan.rows[0][0])


def test_evidence_text_lines_align_columns_and_count_the_rest():
    evidence = Evidence(("node", "share"), (("conv1", 0.5), ("c", math.inf), ("d", None)))
    assert evidence.text_lines(2, "  ") == [
        "  node   share", "  -----  -----", "  conv1  0.5", "  c      inf", "  ... and 1 more"]
    assert Evidence(("a",)).text_lines(8) == ["a", "-"]


def test_finding_round_trips_and_names_a_bad_field():
    evidence = Evidence(("c",), ((1,),))
    finding = Finding("mixed_ranges", Severity.HIGH, math.inf, "t", ("y", "z"), evidence, "f")
    data = json.loads(json.dumps(finding.to_dict()))
    assert data == {"check": "mixed_ranges", "severity": "high", "score": "inf", "title": "t",
                    "subjects": ["y", "z"], "evidence": {"columns": ["c"], "rows": [[1]]}, "fix": "f"}
    assert Finding.from_dict(data) == finding
    with pytest.raises(FormatError, match="field 'severity': expected one of"):
        Finding.from_dict({**data, "severity": "catastrophic"})
