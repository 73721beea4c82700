"""insert_qdq: graph invariants, ONNX Runtime output against the NumPy fake-quant oracle, errors."""
from __future__ import annotations

import models
import models_qdq
import numpy as np
import onnx
import pytest
from qdq_oracle import (
    CASES,
    EXACT,
    OPTIMIZED,
    Oracle,
    calibrated,
    check_record_matches_graph,
    dq_feeding,
    forward_concat_convs,
    forward_conv_residual,
    initializer,
    producers,
    run,
)

from quantdbg.calibration import CalibrationResult, TensorRange
from quantdbg.config import QuantConfig, TensorKind
from quantdbg.errors import ModelError, NotCalibratedError
from quantdbg.placement import plan_qdq
from quantdbg.qdq import insert_qdq


def test_conv_gemm_matmul_inputs_come_from_records_dq(rng):
    for build, forward, shape in CASES.values():
        model = build()
        x = rng.standard_normal(shape).astype(np.float32)
        plan = plan_qdq(model)
        qm = insert_qdq(model, calibrated(model, forward, x, plan)[0], plan=plan)
        for record in qm.records:
            check_record_matches_graph(qm, record)
        by_input = {(r.node, r.input_index): r for r in qm.records}
        for n in model.graph.node:
            if n.op_type in ("Conv", "Gemm", "MatMul"):
                for index in (0, 1):
                    assert (n.name, index) in by_input, f"{n.name} input {index} not quantized"
                    assert dq_feeding(qm.model, n.name, index) is not None
                # the bias is never quantized
                if len(n.input) > 2:
                    assert dq_feeding(qm.model, n.name, 2) is None


def test_weight_scale_is_channel_amax_over_127_and_codes_stay_in_127():
    model = models.conv_relu(channels=6)
    plan = plan_qdq(model)
    qm = insert_qdq(model, CalibrationResult({"x": TensorRange("x", -1, 1, "minmax")}, {}), plan=plan)
    weight = initializer(model, "conv.w")
    (record,) = [r for r in qm.records if r.kind is TensorKind.WEIGHT]
    amax = np.abs(weight).reshape(6, -1).max(axis=1)
    np.testing.assert_allclose(record.scale, amax / 127, rtol=1e-6)
    scale = np.asarray(record.scale, np.float32).reshape(6, 1, 1, 1)
    codes = np.rint(weight / scale)
    assert codes.min() >= -127 and codes.max() <= 127
    assert record.calibrator == "absmax" and record.quantize_node is not None


# The output-channel axis of each weight, read off the layouts ONNX defines: Conv W [C_out, C_in, k...]
# -> 0; ConvTranspose W [C_in, C_out, k...] -> 1; Gemm B [K, N] -> 1, with transB=1 B is [N, K] -> 0;
# MatMul B [K, N] -> 1.
OUTPUT_CHANNEL_AXIS = {
    "fc1.w": 0,  # mlp: Gemm, transB=1, B (16, 8) = [N=16, K=8]
    "fc2.w": 1,  # mlp: MatMul, B (16, 4) = [K=16, N=4]
    "q.w": 1, "k.w": 1,  # attention_matmuls: MatMul, B (8, 8) = [K, N]
    "deconv.w": 1,  # deconv_gemm: ConvTranspose, W (2, 3, 2, 2) = [C_in=2, C_out=3, kh, kw]
    "fc.w": 1,  # deconv_gemm: Gemm, transB=0, B (192, 5) = [K=192, N=5]
    "conv_a.w": 0, "conv_b.w": 0, "conv_out.w": 0,  # concat_convs: Conv, W [C_out, C_in, 1, 1]
}


def test_every_weight_scale_is_amax_over_its_output_channel_axis(rng):
    seen = set()
    for model in (models.mlp(), models.attention_matmuls(), models_qdq.deconv_gemm(), models.concat_convs()):
        plan = plan_qdq(model)
        ranges = {t: TensorRange(t, -1, 1, "minmax") for t in plan.activation_tensors}
        qm = insert_qdq(model, CalibrationResult(ranges, {}), plan=plan)
        for record in (r for r in qm.records if r.kind is TensorKind.WEIGHT):
            seen.add(record.tensor)
            axis = OUTPUT_CHANNEL_AXIS[record.tensor]
            w = initializer(model, record.tensor)
            assert record.axis == axis, record.tensor
            amax = np.abs(w).max(axis=tuple(a for a in range(w.ndim) if a != axis))
            np.testing.assert_allclose(record.scale, amax / 127, rtol=1e-6)
            assert len(record.scale) == w.shape[axis]
    assert seen == set(OUTPUT_CHANNEL_AXIS)


def test_concat_inputs_share_one_scale_with_the_output(rng):
    model = models.concat_convs()
    x = rng.standard_normal((4, 3, 8, 8)).astype(np.float32)
    plan = plan_qdq(model)
    assert plan.shared_scale_groups == (("a", "b_scaled", "cat"),)
    calibration, _ = calibrated(model, forward_concat_convs, x, plan)
    qm = insert_qdq(model, calibration, plan=plan)
    shared = {r.scale for r in qm.records if r.tensor in ("a", "b_scaled", "cat")}
    assert len(shared) == 1
    biggest = max(calibration.ranges[n].amax for n in ("a", "b_scaled", "cat"))
    assert shared.pop()[0] == pytest.approx(biggest / 127, rel=1e-6)
    for index in (0, 1):
        assert dq_feeding(qm.model, "concat", index) is not None


def test_excluded_nodes_get_no_qdq_and_lose_dependent_rules(rng):
    model = models.conv_residual()
    plan = plan_qdq(model, QuantConfig(exclude=("conv2",)))
    assert "conv2" not in plan.layers
    assert "add" not in plan.layers  # the Add no longer has a quantized Conv producer to fuse into
    globbed = plan_qdq(models.concat_convs(), QuantConfig(exclude=("conv_*",)))
    assert globbed.targets == ()  # nothing consumes the Concat output as INT8 any more
    x = rng.standard_normal((2, 4, 8, 8)).astype(np.float32)
    qm = insert_qdq(model, calibrated(model, forward_conv_residual, x, plan)[0], plan=plan)
    assert dq_feeding(qm.model, "conv2", 0) is None and dq_feeding(qm.model, "conv2", 1) is None


def test_no_qdq_on_graph_outputs_or_on_node_outputs(rng):
    for build, forward, shape in CASES.values():
        model = build()
        x = rng.standard_normal(shape).astype(np.float32)
        qm = insert_qdq(model, calibrated(model, forward, x, plan_qdq(model))[0])
        made = producers(qm.model)
        for output in qm.model.graph.output:
            assert made[output.name].op_type not in ("QuantizeLinear", "DequantizeLinear")
        quantized_inputs = {r.tensor for r in qm.records}
        for q in (n for n in qm.model.graph.node if n.op_type == "QuantizeLinear"):
            assert q.input[0] in quantized_inputs


def test_one_pair_per_node_input_even_for_a_shared_tensor(rng):
    model = models.concat_convs()
    x = rng.standard_normal((2, 3, 8, 8)).astype(np.float32)
    qm = insert_qdq(model, calibrated(model, forward_concat_convs, x, plan_qdq(model))[0])
    on_x = [r for r in qm.records if r.tensor == "x"]
    assert {r.node for r in on_x} == {"conv_a", "conv_b"}
    assert len({r.quantize_node for r in on_x}) == len({r.dequantize_node for r in on_x}) == 2


def test_unnamed_nodes_are_named_consistently():
    model = models_qdq.unnamed_nodes()
    plan = plan_qdq(model)
    assert plan.layers == ("Gemm_0", "MatMul_2")
    ranges = {t: TensorRange(t, -2, 2, "minmax") for t in plan.activation_tensors}
    qm = insert_qdq(model, CalibrationResult(ranges, {}), plan=plan)
    assert qm.layers == plan.layers
    assert {n.name for n in qm.model.graph.node} >= set(plan.layers)


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("config", [EXACT, OPTIMIZED], ids=["float-simulated", "ort-optimized"])
def test_ort_output_matches_numpy_fake_quant(case, config, rng):
    build, forward, shape = CASES[case]
    model = build()
    x = rng.standard_normal(shape).astype(np.float32)
    plan = plan_qdq(model)
    calibration, amax = calibrated(model, forward, x, plan)
    qm = insert_qdq(model, calibration, plan=plan)
    expected = forward(Oracle(model, amax), x)["y"]
    fp32 = forward(Oracle(model), x)["y"]
    got = run(qm.model, {"x": x}, config)
    assert np.abs(fp32 - expected).max() > 1e-2  # the quantization is visible at all
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)


def test_all_zero_weight_channel_gets_a_defined_scale(rng):
    model = models_qdq.conv_dead_channel()
    qm = insert_qdq(model, CalibrationResult({"x": TensorRange("x", -3, 3, "minmax")}, {}))
    (record,) = [r for r in qm.records if r.kind is TensorKind.WEIGHT]
    assert record.scale[1] == pytest.approx(1 / 127) and all(s > 0 for s in record.scale)
    y = run(qm.model, {"x": rng.standard_normal((1, 3, 8, 8)).astype(np.float32)})
    assert np.all(y[:, 1] == 0) and np.all(np.isfinite(y))


def test_missing_range_names_tensor_and_node():
    model = models.conv_residual()
    plan = plan_qdq(model)
    ranges = {t: TensorRange(t, -1, 1, "minmax") for t in plan.activation_tensors if t != "r1"}
    with pytest.raises(NotCalibratedError) as err:
        insert_qdq(model, CalibrationResult(ranges, {}), plan=plan)
    assert str(err.value).startswith(
        "Activation tensor 'r1' (input of node 'conv2') has no calibrated range.")


def test_exclude_skips_nodes_and_rejects_unknown_names():
    model = models.conv_residual()
    plan = plan_qdq(model)
    ranges = {t: TensorRange(t, -1, 1, "minmax") for t in plan.activation_tensors if t != "r1"}
    qm = insert_qdq(model, CalibrationResult(ranges, {}), plan=plan, exclude={"conv2"})
    assert "conv2" not in qm.layers and dq_feeding(qm.model, "conv2", 0) is None
    with pytest.raises(ModelError, match=r"No quantizable node named 'conv9' in the model. Did you mean"):
        insert_qdq(model, CalibrationResult(ranges, {}), plan=plan, exclude={"conv9"})


def test_input_model_is_not_modified_and_result_passes_checker():
    model = models.conv_residual()
    before = model.SerializeToString()
    plan = plan_qdq(model)
    qm = insert_qdq(model, CalibrationResult({t: TensorRange(t, -1, 1, "minmax")
                                              for t in plan.activation_tensors}, {}), plan=plan)
    assert model.SerializeToString() == before
    onnx.checker.check_model(qm.model, full_check=True)
