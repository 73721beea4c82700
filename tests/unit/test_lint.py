"""The TensorRT Q/DQ lint: one model per rule, a clean model, ordering, rendering, round trips."""
from __future__ import annotations

import json

import models
import models_lint
import numpy as np
import onnx
import pytest

from quantdbg.diagnostics import RULES, Finding, LintReport, Severity, lint
from quantdbg.diagnostics.findings import NO_EVIDENCE
from quantdbg.errors import ConfigError, FormatError

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
    "clipped-weight": "conv",
    "channel-alignment": "conv",
}


def test_every_rule_has_a_model():
    assert set(models_lint.RULE_MODELS) | {"no-qdq"} == set(RULES) == set(EXPECTED_NODE) | {"no-qdq"}


@pytest.mark.parametrize("rule", sorted(models_lint.RULE_MODELS))
def test_each_rule_fires_alone_on_its_model(rule):
    report = lint(models_lint.RULE_MODELS[rule]())
    assert [(f.check, f.subjects) for f in report.findings] == [(rule, (EXPECTED_NODE[rule],))]
    finding = report.findings[0]
    assert finding.severity is RULES[rule].severity
    assert finding.title and finding.fix
    assert finding.score == 0.0 and finding.evidence == NO_EVIDENCE


@pytest.mark.parametrize("build", [models_lint.clean_conv_block, models_lint.int8_conv_then_fp16_conv])
def test_tensorrt_style_placement_is_clean(build):
    assert lint(build()).findings == ()


def test_float_model_reports_no_qdq():
    report = lint(models.conv_relu())
    assert [f.check for f in report.findings] == ["no-qdq"]


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
    message = lint(models_lint.RULE_MODELS[rule]()).findings[0].title
    for fragment in fragments:
        assert fragment in message


def test_add_behind_quantized_conv_names_the_blocked_fusion():
    finding, = lint(models_lint.qdq_between_conv_and_add()).findings
    assert finding.check == "add-without-producer"
    assert "The Q/DQ between 'conv' and this Add blocks the 'conv'+Add fusion." in finding.title


def _lint_finding(rule: str, node: str, message: str = "m", fix: str = "f") -> Finding:
    return Finding(rule, RULES[rule].severity, 0.0, message, (node,), NO_EVIDENCE, fix)


def test_rules_use_the_shared_scale_and_lint_counts_what_its_rules_give():
    assert {r.severity for r in RULES.values()} == {Severity.HIGH, Severity.MEDIUM, Severity.INFO}
    assert RULES["nonzero-zero-point"].severity is Severity.HIGH  # was "error"
    assert RULES["per-tensor-weight"].severity is Severity.MEDIUM  # was "warning"
    assert list(LintReport(()).counts()) == ["high", "medium", "info"]  # no rule gives "low"


def test_findings_sorted_high_medium_info():
    model = models_lint.quantized_conv("three_problems", zero_point=5, weight_axis=None, c_out=12)
    report = lint(model)
    assert [(f.severity, f.check) for f in report.findings] == [
        (Severity.HIGH, "nonzero-zero-point"), (Severity.MEDIUM, "per-tensor-weight"),
        (Severity.INFO, "channel-alignment")]
    assert report.counts() == {"high": 1, "medium": 1, "info": 1}
    assert [f.check for f in report.at_or_above(Severity.MEDIUM)] == ["nonzero-zero-point",
                                                                      "per-tensor-weight"]
    assert report.at_or_above("warning") == report.at_or_above(Severity.MEDIUM)  # lint's former word


@pytest.mark.parametrize("fail_on, fails", [("error", True), ("high", True), ("never", False)])
def test_fails_reads_fail_on_words(fail_on, fails):
    report = lint(models_lint.nonzero_zero_point())
    assert report.fails(fail_on) is fails


def test_fails_rejects_an_unknown_word():
    with pytest.raises(ConfigError, match="Unknown severity 'fatal'; choose one of high, medium, low, info"):
        LintReport(()).fails("fatal")


def test_report_sorts_findings_given_out_of_order():
    info = _lint_finding("channel-alignment", "b")
    high = _lint_finding("nonzero-zero-point", "a")
    zero_b, zero_a = _lint_finding("nonzero-zero-point", "b"), _lint_finding("nonzero-zero-point", "a")
    assert LintReport((info, high)).findings == (high, info)
    assert LintReport((zero_b, zero_a)).findings == (zero_a, zero_b)  # then by node


def test_report_json_round_trip_keeps_lint_keys():
    report = lint(models_lint.quantized_conv("two", zero_point=3, weight_axis=None))
    data = report.to_dict()
    restored = LintReport.from_dict(json.loads(json.dumps(data)))
    assert restored == report
    assert list(data) == ["format", "model", "counts", "findings"] and data["format"] == "quantdbg.lint/1"
    assert data["counts"] == {"high": 1, "medium": 1, "info": 0}
    first = report.findings[0]
    assert data["findings"][0] == {"rule": first.check, "severity": "high", "node": first.subjects[0],
                                   "message": first.title, "fix": first.fix}


def test_a_lint_report_written_with_the_former_words_still_reads():
    entry = {"node": "a", "message": "m", "fix": "f"}
    old = {"model": "m", "counts": {"error": 1, "warning": 1, "info": 0},
           "findings": [{"rule": "nonzero-zero-point", "severity": "error", **entry},
                        {"rule": "per-tensor-weight", "severity": "warning", **entry}]}
    report = LintReport.from_dict(old)
    rules = ("nonzero-zero-point", "per-tensor-weight")
    assert report.findings == tuple(_lint_finding(r, "a") for r in rules)
    assert report.to_dict()["counts"] == {"high": 1, "medium": 1, "info": 0}
    old["findings"][0]["severity"] = "fatal"
    with pytest.raises(FormatError, match=r"findings\[0\].severity.*one of \"high\", \"medium\""):
        LintReport.from_dict(old)


def test_markdown_has_one_row_per_finding_and_escapes_pipes():
    findings = (_lint_finding("no-qdq", "n|1", "a | b", "c"), _lint_finding("non-int8-qdq-type", "n2"))
    text = LintReport(findings, "m.onnx").to_markdown()
    rows = [line for line in text.splitlines() if line.startswith("| ")]
    assert len(rows) == 1 + len(findings)  # header + findings
    assert "| n\\|1 |" in text and "a \\| b" in text
    assert text.index("non-int8-qdq-type") < text.index("no-qdq")  # high first
    assert "| high | non-int8-qdq-type | n2 | m | f |" in text
    assert "TensorRT Q/DQ lint of m.onnx: 1 high, 0 medium, 1 info." in text
    assert "TensorRT Q/DQ lint of the model: no findings." in LintReport(()).to_markdown()


def test_lint_markdown_is_the_reports_markdown():
    # One renderer: the Markdown `quantdbg lint --md` writes is the report's, byte for byte.
    from quantdbg.report import render_markdown

    for report in (LintReport((_lint_finding("no-qdq", "a"),), "m.onnx"), LintReport(())):
        assert report.to_markdown() == render_markdown(report)


def test_skip_leaves_rules_out_and_rejects_unknown_ids():
    model = models_lint.quantized_conv("two", zero_point=3, weight_axis=None)
    assert [f.check for f in lint(model, skip=["nonzero-zero-point"]).findings] == ["per-tensor-weight"]
    with pytest.raises(ConfigError, match="No lint rule named 'per-tensor-weights'. Did you mean "
                                          "'per-tensor-weight'"):
        lint(model, skip=["per-tensor-weights"])


def test_lint_reads_a_path_and_leaves_the_model_untouched(tmp_path):
    model = models_lint.nonzero_zero_point()
    before = model.SerializeToString()
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    file_before = path.read_bytes()
    assert [f.check for f in lint(model).findings] == [f.check for f in lint(path).findings]
    assert model.SerializeToString() == before and path.read_bytes() == file_before
    assert lint(path).model == str(path)


def test_unnamed_nodes_are_reported_by_op_and_index():
    model = models_lint.partially_quantized_conv()
    for node in model.graph.node:
        node.name = ""
    finding, = lint(model).findings
    index = [n.op_type for n in model.graph.node].index("Conv")
    assert finding.subjects == (f"Conv_{index}",)


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
        found.setdefault(f.check, []).append(f)
    return found


def test_onnxruntime_defaults_break_tensorrt_rules(tmp_path):
    """ONNX Runtime's quantize_static defaults, on a model it wrote itself: asymmetric activations
    (non-zero zero points), a bias dequantized from int32, a quantized graph output."""
    found = _by_rule(lint(_ort_quantize(tmp_path)))
    assert {"nonzero-zero-point", "non-int8-qdq-type", "quantized-graph-output"} <= set(found)
    bias, = found["non-int8-qdq-type"]
    assert "int32" in bias.title and "QuantizeBias" in bias.fix


def test_onnxruntime_uint8_activations_are_high(tmp_path):
    from onnxruntime.quantization import QuantType

    found = _by_rule(lint(_ort_quantize(tmp_path, activation_type=QuantType.QUInt8)))
    assert any("uses uint8" in f.title for f in found["non-int8-qdq-type"])


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
    assert [(f.check, f.subjects) for f in findings] == [("dq-into-float-op", ("lstm",))]


def _sqnr(w: np.ndarray, q: np.ndarray) -> float:
    return float(10 * np.log10(np.sum(w.astype(np.float64) ** 2) / np.sum((w.astype(np.float64) - q) ** 2)))


def _oracle(w: np.ndarray, scale: float) -> tuple[float, float]:
    """(SQNR with one int8 scale, SQNR per output channel with max|w|/127), by hand."""
    w = w.astype(np.float64)
    ours = np.clip(np.round(w / scale), -128, 127) * scale
    channel = np.abs(w).reshape(w.shape[0], -1).max(axis=1).reshape(-1, 1, 1, 1) / 127
    reference = np.clip(np.round(w / channel), -127, 127) * channel
    return _sqnr(w, ours), _sqnr(w, reference)


def _conv_weight(model: onnx.ModelProto) -> np.ndarray:
    """The Conv weight of a clipped_weight model, wherever the model holds it."""
    inits = {i.name: onnx.numpy_helper.to_array(i) for i in model.graph.initializer}
    if "conv.w" in inits:
        return inits["conv.w"]
    if "conv.w.stored" in inits:
        return inits["conv.w.stored"].transpose(1, 0, 2, 3)
    node, = (n for n in model.graph.node if n.op_type == "Constant")
    return onnx.numpy_helper.to_array(node.attribute[0].t)


@pytest.mark.parametrize("held", ["initializer", "constant", "transposed"])
def test_a_clipped_weight_is_high_with_the_sqnr_it_loses(held):
    from quantdbg.diagnostics.qdq_graph import QdqGraph, weight_quantization

    model = models_lint.clipped_weight(held)
    w = _conv_weight(model)
    sqnr, per_channel = _oracle(w, float(np.float32(np.abs(w).max() / 254)))
    assert per_channel - sqnr > 3  # clipping the largest weights costs far more than it saves
    finding, = lint(model).findings
    assert (finding.check, finding.severity, finding.subjects) == ("clipped-weight", Severity.HIGH, ("conv",))
    assert (f"{sqnr:.1f} dB SQNR against {per_channel:.1f} dB per output channel "
            f"({per_channel - sqnr:.1f} dB lost)") in finding.title
    assert "with its one scale below max|w|/127" in finding.title
    assert finding.fix.startswith("Quantize the weight per output channel (axis 0) with scale max|w|/127")
    graph = QdqGraph(model)
    (node, dq, weight), = graph.weight_inputs()
    measured = weight_quantization(graph, node, dq, weight)
    assert (measured.tensor, measured.channels, measured.scales, measured.clipped) == ("conv.w", 16, 1, 1)
    assert measured.sqnr_db == pytest.approx(sqnr, abs=1e-9)
    assert measured.per_channel_sqnr_db == pytest.approx(per_channel, abs=1e-9)


def test_a_per_tensor_weight_names_the_sqnr_it_loses_against_per_channel():
    model = models_lint.per_tensor_weight()
    w = onnx.numpy_helper.to_array(next(i for i in model.graph.initializer if i.name == "conv.w"))
    sqnr, per_channel = _oracle(w, float(np.float32(np.abs(w).max() / 127)))
    finding, = lint(model).findings
    assert finding.check == "per-tensor-weight"
    assert (f"quantizes its 16-channel weight 'conv.w' with one scale: {sqnr:.1f} dB SQNR against "
            f"{per_channel:.1f} dB per output channel ({per_channel - sqnr:.1f} dB lost)") in finding.title


def test_per_channel_scales_below_their_channels_range_are_clipped():
    b = models_lint.QdqBuilder("clipped_channels")
    x = b.input("x", ("N", 16, 8, 8))
    w = (b.rng.standard_normal((16, 16, 3, 3)) * 0.3).astype(np.float32)
    scales = np.abs(w).reshape(16, -1).max(axis=1) / 127
    scales[[2, 5]] /= 2  # two channels calibrated to half their range
    b.const("conv.w", w)
    b.node("Conv", [b.qdq(x), b.qdq("conv.w", scales, axis=0, name="conv.w")], "conv", "y", pads=[1, 1, 1, 1])
    b.output("y")
    finding, = lint(b.build()).findings
    assert finding.check == "clipped-weight"
    assert "with 2 of its 16 channel scales below max|w|/127" in finding.title


def test_a_scale_of_max_over_127_5_is_no_clipping(tmp_path):
    # ONNX Runtime's symmetric int8 rule: the largest weight lands half a step past 127.
    b = models_lint.QdqBuilder("max_over_127_5")
    x = b.input("x", ("N", 16, 8, 8))
    w = (b.rng.standard_normal((16, 16, 3, 3)) * 0.3).astype(np.float32)
    b.const("conv.w", w)
    scales = np.abs(w).reshape(16, -1).max(axis=1) / 127.5
    b.node("Conv", [b.qdq(x), b.qdq("conv.w", scales, axis=0, name="conv.w")], "conv", "y", pads=[1, 1, 1, 1])
    b.output("y")
    assert lint(b.build()).findings == ()
