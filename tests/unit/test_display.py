"""Every public result shows in a notebook: a short repr of its key facts (not a dump of its fields),
an HTML fragment, and its main table as a DataFrame, through the display hook."""
from __future__ import annotations

import models_doctor
import numpy as np
import pytest

from quantdbg import _display
from quantdbg.backends import OnnxrtRunnerFactory, OrtConfig
from quantdbg.fallback import FallbackConfig, FallbackTarget, auto_fallback
from quantdbg.report.sections.fallback import metric_label
from quantdbg.sensitivity import SensitivityConfig, VariantEvaluator

pandas = pytest.importorskip("pandas", reason="DataFrames need the [report] extra (pandas)")


@pytest.fixture(scope="module")
def results():
    import models

    found = models_doctor.report_results()
    from quantdbg.qdq import quantize

    model = models.conv_residual()
    data = {"x": np.random.default_rng(1).standard_normal((16, 4, 8, 8), dtype=np.float32)}
    qmodel = quantize(model, data)
    factory = OnnxrtRunnerFactory(OrtConfig(intra_op_num_threads=1))
    with VariantEvaluator(model, qmodel, data, runner_factory=factory) as evaluator:
        fallback = auto_fallback(evaluator, FallbackTarget.min_sqnr(60.0),
                                 FallbackConfig(SensitivityConfig(mode="isolated", evidence=False)))
    return {**found, "quantized": qmodel, "fallback_result": fallback}


def test_reprs_are_short_and_name_the_key_facts(results):
    q, plan, doctor = results["quantized"], results["fallback"], results["doctor"]
    expected = {
        "quantized": f"QuantizedModel({len(q.layers)} quantized layers, {len(q.records)} Q/DQ pairs",
        "fallback": f"FallbackPlan(status={plan.status!r}, {len(plan.exclude)} of {len(plan.ranking)} layers",
        "doctor": f"DoctorReport({doctor.model!r}: {len(doctor.findings)} findings",
        "calibration": f"CalibrationResult({len(results['calibration'].ranges)} activation tensors",
        "sensitivity": "SensitivityReport(mode='local'",
        "lint": "LintReport(",
        "bundle": "ReportBundle('all results': CalibrationResult, SensitivityReport, FallbackPlan",
        "fallback_result": f"FallbackResult(status={results['fallback_result'].plan.status!r}",
    }
    for name, start in expected.items():
        text = repr(results[name])
        assert text.startswith(start), (name, text)
        assert len(text) <= _display.MAX_REPR and "\n" not in text
        assert "records=" not in text and "evaluations=(" not in text  # no dataclass field dump


def test_quantized_model_frame_has_one_row_per_pair(results):
    q = results["quantized"]
    frame = q.to_dataframe()
    assert len(frame) == len(q.records)
    assert list(frame["tensor"]) == [r.tensor for r in q.records]
    assert np.allclose(frame["scale max"], [max(r.scale) for r in q.records])
    assert list(frame["scales"]) == [len(r.scale) for r in q.records]
    assert 'id="qdq-records"' in q._repr_html_()


def test_fallback_result_shows_its_plan_and_ranking(results):
    found = results["fallback_result"]
    frame = found.to_dataframe()
    assert frame.equals(found.plan.to_dataframe())
    value = metric_label(found.plan)  # the values' column is named by their metric and unit
    assert [tuple(row) for row in frame[[value, "met"]].itertuples(index=False)] == \
        [(e.value, e.met) for e in found.plan.evaluations]
    fragment = found._repr_html_()
    assert fragment.index("Verdict") < fragment.index('id="fallback-evaluations"') \
        < fragment.index('id="sensitivity-ranking"')


@pytest.mark.parametrize("name", ["calibration", "sensitivity", "fallback", "lint", "doctor", "bundle"])
def test_report_kinds_frame_and_html_through_the_hook(results, name):
    from quantdbg import report
    from quantdbg.report.html import repr_html

    result = results[name]
    assert result.to_dataframe().equals(report.to_dataframe(result))
    assert result._repr_html_() == repr_html(result)


def test_a_bundle_without_summary_frames_its_results(results):
    bundle = results["bundle"]
    frame = bundle.to_dataframe()
    assert list(frame["kind"]) == ["calibration", "sensitivity", "fallback", "lint", "doctor"]
    assert list(frame["result"]) == [repr(r) for r in bundle.results]


def test_a_type_without_renderers_is_named_not_dumped():
    class Plain(_display.Displayable):
        pass

    assert repr(Plain()) == "Plain(...)"
    with pytest.raises(TypeError, match="Plain has no DataFrame form"):
        Plain().to_dataframe()
