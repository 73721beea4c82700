"""The NNCF benchmark's TensorRT-form rewrite (benchmarks/_nncf_peer.py ``trt_form``): each Q/DQ pair
not INT8 with zero point 0 becomes INT8, zero point 0, over the same clipping range; checked against
a NumPy oracle of ONNX's QuantizeLinear/DequantizeLinear."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from _nncf_peer import quantizer_types, trt_form  # noqa: E402

SCALE = np.float32(0.05)


def qdq_model(zero_point: np.ndarray | None, scale: np.ndarray = SCALE, const_scale: bool = False
              ) -> onnx.ModelProto:
    """x -> QuantizeLinear -> DequantizeLinear -> y, the pair sharing its scale and zero point
    initializers and the quantized tensor's type recorded in value_info (as NNCF writes them); no zero
    point input when ``zero_point`` is None."""
    inits = [] if const_scale else [numpy_helper.from_array(np.asarray(scale, np.float32), "s")]
    nodes = [helper.make_node("Constant", [], ["s"], value=numpy_helper.from_array(
        np.asarray(scale, np.float32)))] if const_scale else []
    qparams = ["s"]
    if zero_point is not None:
        inits.append(numpy_helper.from_array(zero_point, "zp"))
        qparams.append("zp")
    nodes += [helper.make_node("QuantizeLinear", ["x", *qparams], ["q"], name="q_x"),
              helper.make_node("DequantizeLinear", ["q", *qparams], ["y"], name="dq_x")]
    graph = helper.make_graph(nodes, "qdq", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    return onnx.shape_inference.infer_shapes(model)


def run(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    options = ort.SessionOptions()
    options.add_session_config_entry("session.disable_quant_qdq", "1")
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


def int8_oracle(x: np.ndarray, scale: np.float32) -> np.ndarray:
    """ONNX's Q then DQ with INT8, zero point 0 (round half to even, saturate)."""
    return (np.clip(np.round(x / scale), -128, 127).astype(np.float32) * scale).astype(np.float32)


@pytest.mark.parametrize(("zero_point", "qmin", "qmax"), [
    (np.uint8(0), 0, 255),  # NNCF's ReLU outputs
    (np.uint8(200), 0, 255),
    (np.int8(-5), -128, 127),
    (None, 0, 255),  # no zero point: UINT8, zero point 0
])
def test_rewritten_pair_is_int8_symmetric_over_the_same_range(zero_point, qmin, qmax, rng):
    model = qdq_model(None if zero_point is None else np.asarray(zero_point))
    original = model.SerializeToString()
    zp = 0 if zero_point is None else int(zero_point)
    x = rng.uniform(-20.0, 20.0, 4001).astype(np.float32)

    rewritten, changed = trt_form(model)

    assert changed == 1
    assert model.SerializeToString() == original  # the input model is left as it was
    onnx.checker.check_model(rewritten, full_check=True)  # types agree with the INT8 zero point
    new_scale = np.float32(np.float64(SCALE) * max(zp - qmin, qmax - zp) / 127)
    np.testing.assert_allclose(run(rewritten, x), int8_oracle(x, new_scale), rtol=0, atol=1e-6)
    largest = float(SCALE) * max(zp - qmin, qmax - zp)  # the old pair's largest magnitude: INT8's 127
    assert run(rewritten, x).max() == pytest.approx(largest, rel=1e-6)
    assert quantizer_types(rewritten) == {"total": 1, "non_int8": 0, "by_type": {"INT8": 1}}
    assert {t.name for t in rewritten.graph.initializer} == {"q_trt_scale", "q_trt_zero_point"}


def test_int8_zero_point_zero_is_left_alone(rng):
    model = qdq_model(np.asarray(np.int8(0)))
    rewritten, changed = trt_form(model)
    assert changed == 0
    assert rewritten.SerializeToString() == model.SerializeToString()
    x = rng.uniform(-9.0, 9.0, 501).astype(np.float32)
    np.testing.assert_allclose(run(rewritten, x), int8_oracle(x, SCALE), rtol=0, atol=1e-6)


def test_per_channel_pair_gets_per_channel_scales():
    scale = np.array([0.1, 0.02, 0.5], np.float32)
    zero_point = np.array([0, 128, 255], np.uint8)
    model = qdq_model(zero_point, scale)
    init = {t.name: numpy_helper.to_array(t) for t in trt_form(model)[0].graph.initializer}
    expected = scale.astype(np.float64) * np.array([255, 128, 255]) / 127
    np.testing.assert_allclose(init["q_trt_scale"], expected.astype(np.float32), rtol=1e-7)
    assert init["q_trt_zero_point"].dtype == np.int8 and not init["q_trt_zero_point"].any()


def test_quantizer_types_counts_uint8():
    assert quantizer_types(qdq_model(np.asarray(np.uint8(0)))) == {
        "total": 1, "non_int8": 1, "by_type": {"UINT8": 1}}


def test_scale_outside_initializers_is_refused():
    with pytest.raises(ValueError, match=r"QuantizeLinear 'q_x': its scale 's' is not an initializer"):
        trt_form(qdq_model(np.asarray(np.uint8(0)), const_scale=True))


def test_stored_uint8_tensor_is_refused():
    graph = helper.make_graph(
        [helper.make_node("DequantizeLinear", ["w", "s", "zp"], ["y"], name="dq_w")], "dq", [],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
        [numpy_helper.from_array(np.array([3, 250], np.uint8), "w"),
         numpy_helper.from_array(SCALE, "s"), numpy_helper.from_array(np.uint8(7), "zp")])
    with pytest.raises(ValueError, match=r"DequantizeLinear 'dq_w' reads a stored quantized tensor"):
        trt_form(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]))


def test_table_cell_shows_both_metrics_and_reads_rows_recorded_before():
    from auto import _trt_cell

    types = {"total": 6, "non_int8": 5, "by_type": {"INT8": 1, "UINT8": 5}, "rewritten": 5}
    nncf = {"int8_trt": 0.913, "final_trt": 0.915, "uint8_quantizers": {"int8": types, "final": types}}
    assert _trt_cell(nncf) == "0.9130 / 0.9150 (5 of 6 UINT8)"
    reverted = {**types, "total": 4, "non_int8": 3, "by_type": {"INT8": 1, "UINT8": 3}, "rewritten": 3}
    assert _trt_cell({**nncf, "uint8_quantizers": {"int8": types, "final": reverted}}) == (
        "0.9130 / 0.9150 (3 of 4 UINT8; INT8 model 5)")
    assert _trt_cell({"int8": 0.9, "final": 0.9}) == "n/a"  # a journal row from before
    # INT8 with a nonzero zero point (asymmetric) is rewritten too, and said so
    shifted = {"total": 36, "non_int8": 0, "by_type": {"INT8": 36}, "rewritten": 20}
    assert _trt_cell({**nncf, "uint8_quantizers": {"int8": shifted, "final": shifted}}) == (
        "0.9130 / 0.9150 (20 of 36 INT8 with a nonzero zero point)")
