"""plan_qdq: which (node, input) pairs get Q/DQ, the channel axes, the residual and Concat rules, and
the plan's JSON form."""
from __future__ import annotations

import json

import models
import models_qdq
import numpy as np
import pytest

from quantdbg.config import QuantConfig, TensorKind
from quantdbg.errors import FormatError, ModelError
from quantdbg.placement import QdqPlan, QuantTarget, plan_qdq


def test_weights_per_output_channel_with_the_right_axis():
    expected = {"conv": 0, "fc1": 0, "fc2": 1, "deconv": 1, "fc": 1}
    for model in (models.conv_relu(), models.mlp(), models_qdq.deconv_gemm()):
        for target in plan_qdq(model).targets:
            if target.kind is TensorKind.WEIGHT:
                assert target.axis == expected[target.node], target
    channels = plan_qdq(models.mlp(), QuantConfig(per_channel=False)).targets
    assert all(t.axis is None for t in channels)


def test_residual_add_gets_its_identity_input_quantized():
    plan = plan_qdq(models.conv_residual())
    adds = [t for t in plan.targets if t.node == "add"]
    assert [(t.input_index, t.tensor) for t in adds] == [(1, "x")]
    off = plan_qdq(models.conv_residual(), QuantConfig(quantize_residual_add=False))
    assert "add" not in off.layers


def test_projection_residual_quantizes_exactly_one_add_input():
    plan = plan_qdq(models_qdq.projection_residual())
    assert [(t.input_index, t.tensor) for t in plan.targets if t.node == "add"] == [(1, "shortcut")]


def test_nested_concats_form_one_group():
    plan = plan_qdq(models_qdq.nested_concat())
    (group,) = plan.shared_scale_groups
    assert sorted(group) == ["a", "ab", "abc", "b", "c"]
    assert {"cat_inner", "cat_outer", "conv"} <= set(plan.layers)


def test_unknown_exclude_is_an_error_with_suggestions():
    with pytest.raises(ModelError) as err:
        plan_qdq(models.conv_residual(), QuantConfig(exclude=("conv3",)))
    assert str(err.value) == ("QuantConfig.exclude entry 'conv3' matches no node. No node named 'conv3' "
                              "in the model. Did you mean 'conv2', 'conv1'?")


def test_plan_queries_follow_its_targets():
    plan = plan_qdq(models.concat_convs())
    targets = plan.targets
    assert plan.activation_tensors == tuple(dict.fromkeys(
        t.tensor for t in targets if t.kind is TensorKind.ACTIVATION))
    assert plan.weight_tensors == ("conv_a.w", "conv_b.w", "conv_out.w")
    assert plan.layers == ("conv_a", "conv_b", "concat", "conv_out")
    assert plan.consumer_ops("x") == ("Conv",) and plan.consumer_ops("a") == ("Concat",)
    assert plan.group_of("b_scaled") == ("a", "b_scaled", "cat") and plan.group_of("x") == ("x",)


def test_plan_json_form_and_round_trip():
    plan = plan_qdq(models.concat_convs())
    data = json.loads(json.dumps(plan.to_dict()))
    assert data["shared_scale_groups"] == [["a", "b_scaled", "cat"]]
    conv_a = {"node": "conv_a", "op_type": "Conv"}
    assert data["targets"][:2] == [
        {**conv_a, "input_index": 0, "tensor": "x", "kind": "activation", "axis": None},
        {**conv_a, "input_index": 1, "tensor": "conv_a.w", "kind": "weight", "axis": 0}]
    again = QdqPlan.from_dict(data)
    assert again == plan and all(t.kind in TensorKind for t in again.targets)
    assert QuantTarget.from_dict(data["targets"][1]) == plan.targets[1]
    with pytest.raises(FormatError) as err:
        QdqPlan.from_dict({"targets": [{**data["targets"][0], "kind": "bias"}]}, "plan.json")
    assert str(err.value) == ("plan.json: not a valid QdqPlan: field 'targets[0].kind': expected one of "
                              "\"weight\", \"activation\", got \"bias\".")


def test_a_plan_lists_the_weights_loading_folded_and_plans_them_as_weights():
    import export_forms
    import models_weights

    from quantdbg.model.load import as_loaded

    clean = plan_qdq(models_weights.attention_block())
    model = export_forms.constants(models_weights.attention_block())
    for plan in (plan_qdq(as_loaded(model)), plan_qdq(model)):  # loaded, or folded by the plan itself
        assert plan.targets == clean.targets
        assert [(f.node, f.input_index, f.ops) for f in plan.folded_weights] == [
            (node, 1, ("Constant",)) for node in ("q_proj", "k_proj", "v_proj", "out_proj")]
        assert QdqPlan.from_dict(json.loads(json.dumps(plan.to_dict()))) == plan
    assert clean.folded_weights == ()


def test_a_tensor_constants_compute_is_never_an_activation_target():
    from onnx import helper, numpy_helper

    model = models.conv_residual()
    # The residual Add reads a constant (from a Constant node) instead of x: nothing to calibrate.
    value = numpy_helper.from_array(np.ones((1, 4, 8, 8), np.float32), "bias_map")
    model.graph.node.insert(0, helper.make_node("Constant", [], ["bias_map"], name="bias_map/Constant",
                                                value=value))
    add = next(n for n in model.graph.node if n.name == "add")
    add.input[1] = "bias_map"
    plan = plan_qdq(model)
    assert "bias_map" not in plan.activation_tensors
    assert "add" not in plan.layers
