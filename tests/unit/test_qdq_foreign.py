"""records_from_model: the records of Q/DQ models quantized elsewhere (and by quantdbg), and their removal."""
from __future__ import annotations

import models
import numpy as np
import pytest
from qdq_oracle import (
    Oracle,
    forward_conv_residual,
    initializer,
    ort_quantize_static,
    producers,
    quantized,
    run,
)

from quantdbg.config import Precision, TensorKind
from quantdbg.errors import QuantDbgWarning
from quantdbg.qdq import QdqRecord, records_from_model, remove_qdq


def test_records_from_model_recovers_quantdbg_records_from_the_graph(rng):
    _, qm, _ = quantized("concat_convs", rng.standard_normal((2, 3, 8, 8)).astype(np.float32))
    found = records_from_model(qm.model)
    assert [r.node for r in found.records] == [r.node for r in qm.records]
    for ours, theirs in zip(qm.records, found.records, strict=True):
        assert theirs == QdqRecord(**{**ours.to_dict(), "scale": ours.scale, "zero_point": ours.zero_point,
                                      "calibrator": "external"})


def test_ort_quantize_static_model_records_and_full_removal(rng, tmp_path):
    model = models.conv_residual()
    feeds = [{"x": rng.standard_normal((2, 4, 8, 8)).astype(np.float32)} for _ in range(3)]
    ort_model = ort_quantize_static(model, feeds, tmp_path)
    qm = records_from_model(ort_model)
    weights = {r.node: r for r in qm.records if r.kind is TensorKind.WEIGHT}
    assert set(weights) == {"conv1", "conv2"}
    for record in weights.values():  # stored as INT8 initializers: DQ only, per channel on axis 0
        assert record.quantize_node is None and record.axis == 0 and len(record.scale) == 4
        stored = initializer(ort_model, record.tensor)
        assert stored.dtype == np.int8
    assert {(r.node, r.input_index) for r in qm.records if r.kind is TensorKind.ACTIVATION} >= {
        ("conv1", 0), ("conv2", 0), ("add", 0), ("add", 1)}

    back = remove_qdq(qm, qm.layers, Precision.FP32)
    # Only the pair ONNX Runtime put on the graph output stays: it feeds no node, so no layer owns it.
    (q_out,) = [n for n in back.model.graph.node if n.op_type == "QuantizeLinear"]
    assert producers(back.model)[q_out.input[0]].name == "add"
    # Oracle: the FP32 model with each weight replaced by its dequantized INT8 values.
    dequantized = Oracle(model)
    for name, record in (("conv1.w", weights["conv1"]), ("conv2.w", weights["conv2"])):
        codes = initializer(ort_model, record.tensor).astype(np.float32)
        dequantized.w[name] = codes * np.asarray(record.scale, np.float32).reshape(-1, 1, 1, 1)
    x = feeds[0]["x"]
    expected = forward_conv_residual(dequantized, x)["y"]
    out_scale, out_zp = initializer(ort_model, q_out.input[1]), initializer(ort_model, q_out.input[2])
    codes = np.clip(np.rint(expected / out_scale) + out_zp.astype(np.float32), -128, 127)
    expected = (codes - out_zp.astype(np.float32)) * out_scale
    # ONNX Runtime deleted the Relu before conv2 (its Q/DQ clamps at zero); removal restores it.
    np.testing.assert_allclose(run(back.model, {"x": x}), expected, rtol=1e-5, atol=1e-5)
    partly = remove_qdq(qm, ["conv2"], Precision.FP16)
    assert {r.node for r in partly.records} == set(qm.layers) - {"conv2"}
    assert np.all(np.isfinite(run(partly.model, {"x": x})))


def test_records_from_an_fp32_model_warn_and_are_empty():
    with pytest.warns(QuantDbgWarning, match=r"holds no DequantizeLinear feeding a compute node"):
        found = records_from_model(models.mlp())
    assert found.records == () and found.layers == ()


def _foreign_matmul(weight_chain: str) -> tuple:
    """y = x @ W, quantized elsewhere with the weight Q/DQ pair after a Transpose or a Cast of the
    stored initializer (as tf2onnx and half-precision exports leave it), per tensor."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(3)
    w = rng.standard_normal((6, 5)).astype(np.float32)
    if weight_chain == "Transpose":
        stored, chain = w.T.copy(), helper.make_node("Transpose", ["w.stored"], ["w"], "w_t", perm=[1, 0])
    else:
        stored, chain = w.astype(np.float16), helper.make_node("Cast", ["w.stored"], ["w"], "w_cast",
                                                               to=TensorProto.FLOAT)
    w_amax = float(np.abs(stored.astype(np.float32)).max())
    inits = [numpy_helper.from_array(stored, "w.stored"),
             numpy_helper.from_array(np.array(w_amax / 127, np.float32), "w.scale"),
             numpy_helper.from_array(np.array(3.0 / 127, np.float32), "x.scale"),
             numpy_helper.from_array(np.array(0, np.int8), "zp")]
    nodes = [chain,
             helper.make_node("QuantizeLinear", ["x", "x.scale", "zp"], ["x.q"], "x_q"),
             helper.make_node("DequantizeLinear", ["x.q", "x.scale", "zp"], ["x.dq"], "x_dq"),
             helper.make_node("QuantizeLinear", ["w", "w.scale", "zp"], ["w.q"], "w_q"),
             helper.make_node("DequantizeLinear", ["w.q", "w.scale", "zp"], ["w.dq"], "w_dq"),
             helper.make_node("MatMul", ["x.dq", "w.dq"], ["y"], "fc")]
    x_info = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 6])
    y_info = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 5])
    graph = helper.make_graph(nodes, "foreign", [x_info], [y_info], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    return model, w.astype(np.float16).astype(np.float32) if weight_chain == "Cast" else w


@pytest.mark.parametrize("weight_chain", ["Transpose", "Cast"])
def test_weights_behind_a_transpose_or_a_cast_are_read_as_weights_and_removal_restores_them(
        rng, weight_chain):
    model, w = _foreign_matmul(weight_chain)
    qm = records_from_model(model)
    kinds = {(r.node, r.input_index): (r.kind, r.tensor) for r in qm.records}
    assert kinds == {("fc", 0): (TensorKind.ACTIVATION, "x"), ("fc", 1): (TensorKind.WEIGHT, "w")}
    x = rng.standard_normal((2, 6)).astype(np.float32)
    back = remove_qdq(qm, qm.layers, Precision.FP32)
    assert not [n for n in back.model.graph.node if n.op_type in ("QuantizeLinear", "DequantizeLinear")]
    # The FP32 product: the chain that computes the weight is still there, now feeding fc directly.
    np.testing.assert_allclose(run(back.model, {"x": x}), x @ w, rtol=1e-5, atol=1e-5)
