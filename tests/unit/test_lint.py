"""The TensorRT Q/DQ lint: one model per rule, a clean model, ordering, rendering, round trips."""
from __future__ import annotations

import json

import models
import models_lint
import numpy as np
import onnx
import pytest

from quantdbg.diagnostics.linter import RULES, Finding, LintReport, Severity, lint
from quantdbg.errors import ConfigError

# Rule -> the node its model should be reported on (hand-derived from the builders).
EXPECTED_NODE = {
    "unsupported-quantized-op": "matmul_integer",
    "nonzero-zero-point": "x.dequantize",
    "non-int8-qdq-type": "x.dequantize",
    "non-positive-scale": "x.dequantize",
    "per-channel-activation": "x.dequantize",
    "weight-axis": "conv",
    "partially-quantized-op": "conv",
    "dq-into-float-op": "softmax",
    "add-without-producer": "add",
    "concat-scale-mismatch": "concat",
    "qdq-on-weighted-output": "conv",
    "quantized-graph-output": "y.dequantize",
    "per-tensor-weight": "conv",
    "channel-alignment": "conv",
}


def test_every_rule_has_a_model():
    assert set(models_lint.RULE_MODELS) | {"no-qdq"} == set(RULES) == set(EXPECTED_NODE) | {"no-qdq"}


@pytest.mark.parametrize("rule", sorted(models_lint.RULE_MODELS))
def test_each_rule_fires_alone_on_its_model(rule):
    report = lint(models_lint.RULE_MODELS[rule]())
    assert [(f.rule, f.node) for f in report.findings] == [(rule, EXPECTED_NODE[rule])]
    finding = report.findings[0]
    assert finding.severity is RULES[rule].severity
    assert finding.message and finding.fix


@pytest.mark.parametrize("build", [models_lint.clean_conv_block, models_lint.int8_conv_then_fp16_conv])
def test_tensorrt_style_placement_is_clean(build):
    assert lint(build()).findings == ()


def test_float_model_reports_no_qdq():
    report = lint(models.conv_relu())
    assert [f.rule for f in report.findings] == ["no-qdq"]


@pytest.mark.parametrize("rule, fragments", [
    ("nonzero-zero-point", ["zero point 5", "symmetric"]),
    ("weight-axis", ["axis 1", "output-channel axis, 0"]),
    ("concat-scale-mismatch", ["'x1.dq': 0.01", "'x2.dq': 0.02"]),
    ("per-channel-activation", ["16 scales", "axis 1"]),
    ("channel-alignment", ["output channels 12", f"multiples of {16}"]),
    ("qdq-on-weighted-output", ["'silu_mul'"]),
    ("dq-into-float-op", ["Softmax has no INT8 kernel", "quantizes again"]),
])
def test_messages_name_the_evidence(rule, fragments):
    message = lint(models_lint.RULE_MODELS[rule]()).findings[0].message
    for fragment in fragments:
        assert fragment in message


def test_add_behind_quantized_conv_names_the_blocked_fusion():
    finding, = lint(models_lint.qdq_between_conv_and_add()).findings
    assert finding.rule == "add-without-producer"
    assert "The Q/DQ between 'conv' and this Add blocks the 'conv'+Add fusion." in finding.message


def test_findings_sorted_error_warning_info():
    model = models_lint.quantized_conv("three_problems", zero_point=5, weight_axis=None, c_out=12)
    report = lint(model)
    assert [(f.severity, f.rule) for f in report.findings] == [
        (Severity.ERROR, "nonzero-zero-point"), (Severity.WARNING, "per-tensor-weight"),
        (Severity.INFO, "channel-alignment")]
    assert report.counts() == {"error": 1, "warning": 1, "info": 1}
    assert [f.rule for f in report.at_or_above(Severity.WARNING)] == ["nonzero-zero-point",
                                                                       "per-tensor-weight"]


def test_report_sorts_findings_given_out_of_order():
    info = Finding("channel-alignment", Severity.INFO, "b", "m", "f")
    error = Finding("nonzero-zero-point", Severity.ERROR, "a", "m", "f")
    assert LintReport((info, error)).findings == (error, info)


def test_report_json_round_trip():
    report = lint(models_lint.quantized_conv("two", zero_point=3, weight_axis=None))
    restored = LintReport.from_dict(json.loads(json.dumps(report.to_dict())))
    assert restored == report
    assert report.to_dict()["counts"] == {"error": 1, "warning": 1, "info": 0}


def test_markdown_has_one_row_per_finding_and_escapes_pipes():
    findings = (Finding("no-qdq", Severity.INFO, "n|1", "a | b", "c"),
                Finding("non-int8-qdq-type", Severity.ERROR, "n2", "m", "f"))
    text = LintReport(findings, "m.onnx").to_markdown()
    rows = [line for line in text.splitlines() if line.startswith("| ")]
    assert len(rows) == 1 + len(findings)  # header + findings
    assert "`n\\|1`" in text and "a \\| b" in text
    assert text.index("non-int8-qdq-type") < text.index("no-qdq")  # error first
    assert "Errors: 1, warnings: 0, info: 1" in text
    assert "No findings" in LintReport(()).to_markdown()


def test_skip_leaves_rules_out_and_rejects_unknown_ids():
    model = models_lint.quantized_conv("two", zero_point=3, weight_axis=None)
    assert [f.rule for f in lint(model, skip=["nonzero-zero-point"]).findings] == ["per-tensor-weight"]
    with pytest.raises(ConfigError, match="No lint rule named 'per-tensor-weights'. Did you mean "
                                          "'per-tensor-weight'"):
        lint(model, skip=["per-tensor-weights"])


def test_lint_reads_a_path_and_leaves_the_model_untouched(tmp_path):
    model = models_lint.nonzero_zero_point()
    before = model.SerializeToString()
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    file_before = path.read_bytes()
    assert [f.rule for f in lint(model).findings] == [f.rule for f in lint(path).findings]
    assert model.SerializeToString() == before and path.read_bytes() == file_before
    assert lint(path).model == str(path)


def test_unnamed_nodes_are_reported_by_op_and_index():
    model = models_lint.partially_quantized_conv()
    for node in model.graph.node:
        node.name = ""
    finding, = lint(model).findings
    index = [n.op_type for n in model.graph.node].index("Conv")
    assert finding.node == f"Conv_{index}"


def _ort_quantize(tmp_path, **kwargs):
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, quantize_static

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            rng = np.random.default_rng(0)
            self.feeds = iter([{"x": rng.standard_normal((1, 3, 8, 8)).astype(np.float32)} for _ in range(4)])

        def get_next(self):
            return next(self.feeds, None)

    src, dst = tmp_path / "fp32.onnx", tmp_path / "ort_qdq.onnx"
    onnx.save(models.conv_relu(channels=16), str(src))
    quantize_static(str(src), str(dst), Reader(), quant_format=QuantFormat.QDQ, **kwargs)
    return dst


def _by_rule(report):
    found = {}
    for f in report.findings:
        found.setdefault(f.rule, []).append(f)
    return found


def test_onnxruntime_defaults_break_tensorrt_rules(tmp_path):
    """ONNX Runtime's quantize_static defaults, on a model it wrote itself: asymmetric activations
    (non-zero zero points), a bias dequantized from int32, a quantized graph output."""
    found = _by_rule(lint(_ort_quantize(tmp_path)))
    assert {"nonzero-zero-point", "non-int8-qdq-type", "quantized-graph-output"} <= set(found)
    bias, = found["non-int8-qdq-type"]
    assert "int32" in bias.message and "QuantizeBias" in bias.fix


def test_onnxruntime_uint8_activations_are_errors(tmp_path):
    from onnxruntime.quantization import QuantType

    found = _by_rule(lint(_ort_quantize(tmp_path, activation_type=QuantType.QUInt8)))
    assert any("uses uint8" in f.message for f in found["non-int8-qdq-type"])


def test_dequantized_input_into_an_lstm_is_flagged():
    # TensorRT has no INT8 LSTM: a DQ feeding one only adds a reformat layer.
    from onnx import TensorProto, helper, numpy_helper

    from quantdbg.diagnostics import lint

    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(np.float32(0.05), "s"), numpy_helper.from_array(np.int8(0), "zp"),
             numpy_helper.from_array(rng.standard_normal((1, 64, 8), dtype=np.float32), "W"),
             numpy_helper.from_array(rng.standard_normal((1, 64, 16), dtype=np.float32), "R")]
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "zp"], ["xq"], name="q"),
             helper.make_node("DequantizeLinear", ["xq", "s", "zp"], ["xd"], name="dq"),
             helper.make_node("LSTM", ["xd", "W", "R"], ["y"], name="lstm", hidden_size=16)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 1, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 1, 1, 16])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    findings = lint(model).findings
    assert [(f.rule, f.node) for f in findings] == [("dq-into-float-op", "lstm")]
