"""remove_qdq: the FP32/FP16 fallback of quantdbg's own Q/DQ models, against the NumPy oracle."""
from __future__ import annotations

import models
import numpy as np
import onnx
import pytest
from onnx import numpy_helper
from qdq_oracle import (
    CASES,
    Oracle,
    check_record_matches_graph,
    forward_conv_residual,
    forward_mlp,
    node,
    producers,
    quantized,
    run,
)

from quantdbg.calibration import CalibrationResult, TensorRange
from quantdbg.config import Precision
from quantdbg.errors import ModelError, QuantDbgWarning
from quantdbg.placement import plan_qdq
from quantdbg.qdq import insert_qdq, remove_qdq


@pytest.mark.parametrize("case", sorted(CASES))
def test_removing_every_layer_in_fp32_gives_back_the_fp32_model(case, rng):
    x = rng.standard_normal(CASES[case][2]).astype(np.float32)
    model, qm, _ = quantized(case, x)
    back = remove_qdq(qm, qm.layers, Precision.FP32)
    assert back.records == () and back.excluded == qm.layers
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
    expected = forward_conv_residual(Oracle(model, amax, exclude=("conv2",)), x)["y"]
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
    assert mixed.excluded_precision is Precision.FP16
    # fc2 in (FP16-rounded) float, fc1 still fake-quantized
    expected = forward_mlp(Oracle(model, amax, exclude=("fc2",)), x)["y"]
    np.testing.assert_allclose(run(mixed.model, {"x": x}), expected, rtol=1e-2, atol=1e-2)


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


def test_remove_rejects_names_that_are_not_quantized_layers(rng):
    _, qm, _ = quantized("conv_residual", rng.standard_normal((1, 4, 8, 8)).astype(np.float32))
    with pytest.raises(ModelError) as err:
        remove_qdq(qm, ["conv3"])
    assert str(err.value) == "No quantized node named 'conv3' in the model. Did you mean 'conv2', 'conv1'?"
