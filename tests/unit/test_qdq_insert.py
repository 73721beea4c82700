"""Q/DQ placement, insertion, removal and provenance (quantdbg.qdq)."""
from __future__ import annotations

import json
from collections.abc import Callable

import models
import models_qdq
import numpy as np
import onnx
import pytest
from numpy.lib.stride_tricks import sliding_window_view
from onnx import numpy_helper

from quantdbg.backends import OnnxrtRunner, OrtConfig
from quantdbg.calibration import CalibrationResult, TensorRange
from quantdbg.config import Precision, QuantConfig
from quantdbg.errors import ModelError, NotCalibratedError, QuantDbgWarning
from quantdbg.placement import QdqPlan, plan_qdq
from quantdbg.qdq import QdqRecord, QuantizedModel, insert_qdq, records_from_model, remove_qdq

EXACT = OrtConfig(intra_op_num_threads=1, graph_optimization_level="disable")
OPTIMIZED = OrtConfig(intra_op_num_threads=1)


# ----------------------------------------------------------------------------------------------
# NumPy oracle: fake quantization and the maths of the test models, written independently.
# ----------------------------------------------------------------------------------------------

def fq(x: np.ndarray, amax, axis: int | None = None) -> np.ndarray:
    """Quantize-dequantize: symmetric INT8, round half to even, saturate."""
    scale = (np.asarray(amax, np.float64) / 127).astype(np.float32)
    if axis is not None:
        shape = [1] * x.ndim
        shape[axis] = -1
        scale = scale.reshape(shape)
    return (np.clip(np.rint(x / scale), -128, 127) * scale).astype(np.float32)


def fq_weight(w: np.ndarray, axis: int) -> np.ndarray:
    amax = np.abs(w).max(axis=tuple(a for a in range(w.ndim) if a != axis))
    return fq(w, amax, axis)


def conv2d(x: np.ndarray, w: np.ndarray, pad: int = 0) -> np.ndarray:
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    windows = sliding_window_view(xp, w.shape[2:], axis=(2, 3))
    return np.einsum("nchwij,ocij->nohw", windows, w).astype(np.float32)


def relu(v: np.ndarray) -> np.ndarray:
    return np.maximum(v, 0)


class Oracle:
    """Runs a test model's maths in NumPy, fake-quantizing where ``amax`` says (None: FP32)."""

    def __init__(self, model: onnx.ModelProto, amax: dict[str, float] | None = None,
                 keep_fp: tuple[str, ...] = ()) -> None:
        self.w = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
        self.amax = amax
        self.keep_fp = keep_fp

    def act(self, node: str, tensor: str, value: np.ndarray) -> np.ndarray:
        if self.amax is None or node in self.keep_fp:
            return value
        return fq(value, self.amax[tensor])

    def weight(self, node: str, name: str, axis: int) -> np.ndarray:
        if self.amax is None or node in self.keep_fp:
            return self.w[name]
        return fq_weight(self.w[name], axis)


def forward_conv_residual(o: Oracle, x: np.ndarray) -> dict[str, np.ndarray]:
    t = {"x": x}
    t["r1"] = relu(conv2d(o.act("conv1", "x", x), o.weight("conv1", "conv1.w", 0), pad=1))
    t["c2"] = conv2d(o.act("conv2", "r1", t["r1"]), o.weight("conv2", "conv2.w", 0), pad=1)
    t["y"] = relu(t["c2"] + o.act("add", "x", x))
    return t


def forward_concat_convs(o: Oracle, x: np.ndarray) -> dict[str, np.ndarray]:
    t = {"x": x}
    t["a"] = conv2d(o.act("conv_a", "x", x), o.weight("conv_a", "conv_a.w", 0))
    t["b_scaled"] = 10 * conv2d(o.act("conv_b", "x", x), o.weight("conv_b", "conv_b.w", 0))
    t["cat"] = np.concatenate([o.act("concat", "a", t["a"]), o.act("concat", "b_scaled", t["b_scaled"])], 1)
    t["y"] = conv2d(o.act("conv_out", "cat", t["cat"]), o.weight("conv_out", "conv_out.w", 0))
    return t


def forward_mlp(o: Oracle, x: np.ndarray) -> dict[str, np.ndarray]:
    t = {"x": x}
    t["r"] = relu(o.act("fc1", "x", x) @ o.weight("fc1", "fc1.w", 0).T + o.w["fc1.b"])
    t["y"] = o.act("fc2", "r", t["r"]) @ o.weight("fc2", "fc2.w", 1) + o.w["fc2.b"]
    return t


def forward_attention(o: Oracle, x: np.ndarray) -> dict[str, np.ndarray]:
    t = {"x": x}
    t["q"] = o.act("q_proj", "x", x) @ o.weight("q_proj", "q.w", 1)
    t["kt"] = np.swapaxes(o.act("k_proj", "x", x) @ o.weight("k_proj", "k.w", 1), 1, 2)
    t["y"] = o.act("scores", "q", t["q"]) @ o.act("scores", "kt", t["kt"])
    return t


CASES: dict[str, tuple[Callable[[], onnx.ModelProto], Callable, tuple[int, ...]]] = {
    "conv_residual": (models.conv_residual, forward_conv_residual, (4, 4, 8, 8)),
    "concat_convs": (models.concat_convs, forward_concat_convs, (4, 3, 8, 8)),
    "mlp": (models.mlp, forward_mlp, (16, 8)),
    "attention": (models.attention_matmuls, forward_attention, (3, 5, 8)),
}


def calibrated(model: onnx.ModelProto, forward: Callable, x: np.ndarray, plan: QdqPlan,
               clip: float = 0.8) -> tuple[CalibrationResult, dict[str, float]]:
    """Ranges at ``clip`` x the FP32 absmax (so some values saturate), groups sharing the max."""
    fp = forward(Oracle(model), x)
    amax = {name: clip * float(np.abs(fp[name]).max()) for name in plan.activation_tensors}
    ranges = {name: TensorRange(name, -a, a, "minmax") for name, a in amax.items()}
    shared = dict(amax)
    for group in plan.shared_scale_groups:
        for name in group:
            shared[name] = max(amax[m] for m in group)
    return CalibrationResult(ranges, {}), shared


def run(model: onnx.ModelProto, feed: dict[str, np.ndarray], config: OrtConfig = EXACT) -> np.ndarray:
    with OnnxrtRunner(model, config) as runner:
        return runner.infer(feed)["y"]


# ----------------------------------------------------------------------------------------------
# Graph helpers for the invariants
# ----------------------------------------------------------------------------------------------

def producers(model: onnx.ModelProto) -> dict[str, onnx.NodeProto]:
    return {out: node for node in model.graph.node for out in node.output}


def node(model: onnx.ModelProto, name: str) -> onnx.NodeProto:
    return next(n for n in model.graph.node if n.name == name)


def initializer(model: onnx.ModelProto, name: str) -> np.ndarray:
    return next(numpy_helper.to_array(i) for i in model.graph.initializer if i.name == name)


def dq_feeding(model: onnx.ModelProto, node_name: str, index: int) -> onnx.NodeProto | None:
    producer = producers(model).get(node(model, node_name).input[index])
    return producer if producer is not None and producer.op_type == "DequantizeLinear" else None


def axis_of(n: onnx.NodeProto) -> int | None:
    return next((a.i for a in n.attribute if a.name == "axis"), None)


def check_record_matches_graph(qm: QuantizedModel, record: QdqRecord) -> None:
    """The record names the DQ that feeds its input, the Q before it, the tensor, scale and axis."""
    dq = dq_feeding(qm.model, record.node, record.input_index)
    assert dq is not None and dq.name == record.dequantize_node
    q = producers(qm.model)[dq.input[0]]
    assert q.op_type == "QuantizeLinear" and q.name == record.quantize_node
    assert q.input[0] == record.tensor
    assert q.input[1] == dq.input[1] and q.input[2] == dq.input[2]
    np.testing.assert_array_equal(np.atleast_1d(initializer(qm.model, dq.input[1])),
                                  np.asarray(record.scale, np.float32))
    zero_point = initializer(qm.model, dq.input[2])
    assert zero_point.dtype == np.int8 and not zero_point.any()
    assert axis_of(q) == axis_of(dq) == record.axis


# ----------------------------------------------------------------------------------------------
# Placement
# ----------------------------------------------------------------------------------------------

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


def test_weights_per_output_channel_with_the_right_axis():
    expected = {"conv": 0, "fc1": 0, "fc2": 1, "deconv": 1, "fc": 1}
    for model in (models.conv_relu(), models.mlp(), models_qdq.deconv_gemm()):
        for target in plan_qdq(model).targets:
            if target.kind == "weight":
                assert target.axis == expected[target.node], target
    channels = plan_qdq(models.mlp(), QuantConfig(per_channel=False)).targets
    assert all(t.axis is None for t in channels)


def test_weight_scale_is_channel_amax_over_127_and_codes_stay_in_127():
    model = models.conv_relu(channels=6)
    plan = plan_qdq(model)
    qm = insert_qdq(model, CalibrationResult({"x": TensorRange("x", -1, 1, "minmax")}, {}), plan=plan)
    weight = initializer(model, "conv.w")
    (record,) = [r for r in qm.records if r.kind == "weight"]
    amax = np.abs(weight).reshape(6, -1).max(axis=1)
    np.testing.assert_allclose(record.scale, amax / 127, rtol=1e-6)
    scale = np.asarray(record.scale, np.float32).reshape(6, 1, 1, 1)
    codes = np.rint(weight / scale)
    assert codes.min() >= -127 and codes.max() <= 127
    assert record.calibrator == "absmax" and record.quantize_node is not None


def test_residual_add_gets_its_identity_input_quantized():
    plan = plan_qdq(models.conv_residual())
    adds = [t for t in plan.targets if t.node == "add"]
    assert [(t.input_index, t.tensor) for t in adds] == [(1, "x")]
    off = plan_qdq(models.conv_residual(), QuantConfig(quantize_residual_add=False))
    assert "add" not in off.layers


def test_projection_residual_quantizes_exactly_one_add_input():
    plan = plan_qdq(models_qdq.projection_residual())
    assert [(t.input_index, t.tensor) for t in plan.targets if t.node == "add"] == [(1, "shortcut")]


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


def test_nested_concats_form_one_group():
    plan = plan_qdq(models_qdq.nested_concat())
    (group,) = plan.shared_scale_groups
    assert sorted(group) == ["a", "ab", "abc", "b", "c"]
    assert {"cat_inner", "cat_outer", "conv"} <= set(plan.layers)


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


def test_unknown_exclude_is_an_error_with_suggestions():
    with pytest.raises(ModelError) as err:
        plan_qdq(models.conv_residual(), QuantConfig(exclude=("conv3",)))
    assert str(err.value) == ("QuantConfig.exclude entry 'conv3' matches no node. No node named 'conv3' "
                              "in the model. Did you mean 'conv2', 'conv1'?")


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


# ----------------------------------------------------------------------------------------------
# Insertion: numerics against the NumPy oracle, errors, input untouched
# ----------------------------------------------------------------------------------------------

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
    (record,) = [r for r in qm.records if r.kind == "weight"]
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


def test_keep_fp_skips_nodes_and_rejects_unknown_names():
    model = models.conv_residual()
    plan = plan_qdq(model)
    ranges = {t: TensorRange(t, -1, 1, "minmax") for t in plan.activation_tensors if t != "r1"}
    qm = insert_qdq(model, CalibrationResult(ranges, {}), plan=plan, keep_fp={"conv2"})
    assert "conv2" not in qm.layers and dq_feeding(qm.model, "conv2", 0) is None
    with pytest.raises(ModelError, match=r"No quantizable node named 'conv9' in the model. Did you mean"):
        insert_qdq(model, CalibrationResult(ranges, {}), plan=plan, keep_fp={"conv9"})


def test_input_model_is_not_modified_and_result_passes_checker():
    model = models.conv_residual()
    before = model.SerializeToString()
    plan = plan_qdq(model)
    qm = insert_qdq(model, CalibrationResult({t: TensorRange(t, -1, 1, "minmax")
                                              for t in plan.activation_tensors}, {}), plan=plan)
    assert model.SerializeToString() == before
    onnx.checker.check_model(qm.model, full_check=True)


def test_plan_and_records_round_trip_through_json():
    model = models.concat_convs()
    plan = plan_qdq(model)
    assert QdqPlan.from_dict(json.loads(json.dumps(plan.to_dict()))) == plan
    qm = insert_qdq(model, CalibrationResult({t: TensorRange(t, -1, 1, "entropy")
                                              for t in plan.activation_tensors}, {}), plan=plan)
    qm = remove_qdq(qm, ["conv_out"], Precision.FP32)
    again = QuantizedModel.from_dict(json.loads(json.dumps(qm.to_dict())), qm.model)
    assert again == qm


# ----------------------------------------------------------------------------------------------
# Removal (fallback)
# ----------------------------------------------------------------------------------------------

def quantized(case: str, x: np.ndarray) -> tuple[onnx.ModelProto, QuantizedModel, dict[str, float]]:
    build, forward, _ = CASES[case]
    model = build()
    plan = plan_qdq(model)
    calibration, amax = calibrated(model, forward, x, plan)
    return model, insert_qdq(model, calibration, plan=plan), amax


@pytest.mark.parametrize("case", sorted(CASES))
def test_removing_every_layer_in_fp32_gives_back_the_fp32_model(case, rng):
    x = rng.standard_normal(CASES[case][2]).astype(np.float32)
    model, qm, _ = quantized(case, x)
    back = remove_qdq(qm, qm.layers, Precision.FP32)
    assert back.records == () and back.fallback == qm.layers
    assert sorted(n.op_type for n in back.model.graph.node) == sorted(n.op_type for n in model.graph.node)
    for n in model.graph.node:
        assert list(node(back.model, n.name).input) == list(n.input)
    np.testing.assert_array_equal(run(back.model, {"x": x}), run(model, {"x": x}))


def test_removing_one_layer_leaves_the_others_untouched(rng):
    x = rng.standard_normal((4, 4, 8, 8)).astype(np.float32)
    model, qm, amax = quantized("conv_residual", x)
    mixed = remove_qdq(qm, ["conv2"], Precision.FP32)
    assert mixed.records == tuple(r for r in qm.records if r.node != "conv2")
    for record in mixed.records:
        check_record_matches_graph(mixed, record)
    assert list(node(mixed.model, "conv2").input) == list(node(model, "conv2").input)
    expected = forward_conv_residual(Oracle(model, amax, keep_fp=("conv2",)), x)["y"]
    np.testing.assert_allclose(run(mixed.model, {"x": x}), expected, rtol=1e-4, atol=1e-4)


def test_fp16_fallback_casts_around_the_node(rng):
    x = rng.standard_normal((16, 8)).astype(np.float32)
    model, qm, amax = quantized("mlp", x)
    mixed = remove_qdq(qm, ["fc2"], Precision.FP16)
    made = producers(mixed.model)
    fc2 = node(mixed.model, "fc2")
    assert made[fc2.input[0]].op_type == "Cast"
    weight = next(i for i in mixed.model.graph.initializer if i.name == fc2.input[1])
    assert weight.data_type == onnx.TensorProto.FLOAT16
    consumer = next(n for n in mixed.model.graph.node if n.output and fc2.output[0] in n.input)
    assert consumer.op_type == "Cast" and consumer.output[0] == "m"  # FP32 again under its own name
    assert mixed.fallback_precision is Precision.FP16
    # fc2 in (FP16-rounded) float, fc1 still fake-quantized
    expected = forward_mlp(Oracle(model, amax, keep_fp=("fc2",)), x)["y"]
    np.testing.assert_allclose(run(mixed.model, {"x": x}), expected, rtol=1e-2, atol=1e-2)


def test_remove_rejects_names_that_are_not_quantized_layers(rng):
    _, qm, _ = quantized("conv_residual", rng.standard_normal((1, 4, 8, 8)).astype(np.float32))
    with pytest.raises(ModelError) as err:
        remove_qdq(qm, ["conv3"])
    assert str(err.value) == "No quantized node named 'conv3' in the model. Did you mean 'conv2', 'conv1'?"


# ----------------------------------------------------------------------------------------------
# Models quantized elsewhere
# ----------------------------------------------------------------------------------------------

def test_records_from_model_recovers_quantdbg_records_from_the_graph(rng):
    _, qm, _ = quantized("concat_convs", rng.standard_normal((2, 3, 8, 8)).astype(np.float32))
    found = records_from_model(qm.model)
    assert [r.node for r in found.records] == [r.node for r in qm.records]
    for ours, theirs in zip(qm.records, found.records, strict=True):
        assert theirs == QdqRecord(**{**ours.to_dict(), "scale": ours.scale, "zero_point": ours.zero_point,
                                      "calibrator": "external"})


def ort_quantize_static(model: onnx.ModelProto, feeds: list[dict[str, np.ndarray]],
                        tmp_path) -> onnx.ModelProto:
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.feeds = iter(feeds)

        def get_next(self):
            return next(self.feeds, None)

    src, dst = tmp_path / "fp32.onnx", tmp_path / "int8.onnx"
    onnx.save(model, src)
    quantize_static(str(src), str(dst), Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                    activation_type=QuantType.QInt8, weight_type=QuantType.QInt8)
    return onnx.load(dst)


def test_ort_quantize_static_model_records_and_full_removal(rng, tmp_path):
    model = models.conv_residual()
    feeds = [{"x": rng.standard_normal((2, 4, 8, 8)).astype(np.float32)} for _ in range(3)]
    ort_model = ort_quantize_static(model, feeds, tmp_path)
    qm = records_from_model(ort_model)
    weights = {r.node: r for r in qm.records if r.kind == "weight"}
    assert set(weights) == {"conv1", "conv2"}
    for record in weights.values():  # stored as INT8 initializers: DQ only, per channel on axis 0
        assert record.quantize_node is None and record.axis == 0 and len(record.scale) == 4
        stored = initializer(ort_model, record.tensor)
        assert stored.dtype == np.int8
    assert {(r.node, r.input_index) for r in qm.records if r.kind == "activation"} >= {
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


def test_every_weight_scale_is_amax_over_its_axis(rng):
    for model in (models.mlp(), models.attention_matmuls(), models_qdq.deconv_gemm(), models.concat_convs()):
        plan = plan_qdq(model)
        ranges = {t: TensorRange(t, -1, 1, "minmax") for t in plan.activation_tensors}
        qm = insert_qdq(model, CalibrationResult(ranges, {}), plan=plan)
        for record in (r for r in qm.records if r.kind == "weight"):
            w = initializer(model, record.tensor)
            amax = np.abs(w).max(axis=tuple(a for a in range(w.ndim) if a != record.axis))
            np.testing.assert_allclose(record.scale, amax / 127, rtol=1e-6)
            assert len(record.scale) == w.shape[record.axis]


def test_fp16_fallback_saturates_weights_beyond_float16(rng):
    model = models.mlp()
    for init in model.graph.initializer:
        if init.name == "fc2.w":
            init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init) * 1e6, "fc2.w"))
    x = rng.standard_normal((4, 8)).astype(np.float32)
    plan = plan_qdq(model)
    qm = insert_qdq(model, CalibrationResult({t: TensorRange(t, -3, 3, "minmax")
                                              for t in plan.activation_tensors}, {}), plan=plan)
    with pytest.warns(QuantDbgWarning, match=r"Initializer 'fc2.w' of node 'fc2' holds values beyond"):
        mixed = remove_qdq(qm, ["fc2"])
    weight = next(numpy_helper.to_array(i) for i in mixed.model.graph.initializer
                  if i.name == node(mixed.model, "fc2").input[1])
    assert weight.dtype == np.float16 and np.all(np.isfinite(weight))
    assert run(mixed.model, {"x": x}).dtype == np.float32


def test_records_from_an_fp32_model_warn_and_are_empty():
    with pytest.warns(QuantDbgWarning, match=r"holds no DequantizeLinear feeding a compute node"):
        found = records_from_model(models.mlp())
    assert found.records == () and found.layers == ()
