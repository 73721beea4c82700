"""Cross-layer equalization: the FP32 function unchanged, per-channel ranges balanced (NumPy oracle), what
is not crossed, idempotence, names kept, and the INT8 gain on unbalanced channels."""
from __future__ import annotations

import json

import models_repairs as mr
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

from quantdbg.calibration import calibrate, equalize
from quantdbg.calibration.equalization import Equalization
from quantdbg.config import CalibConfig
from quantdbg.qdq import insert_qdq, quantize, remove_qdq


def _run(model: onnx.ModelProto, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, feed), strict=True))


def _inits(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    return {i.name: numpy_helper.to_array(i).astype(np.float64) for i in model.graph.initializer}


def _feed(rng: np.random.Generator, n: int = 4) -> dict[str, np.ndarray]:
    return {"x": rng.standard_normal((n, 3, 8, 8)).astype(np.float32),
            "z": rng.standard_normal((n, 16)).astype(np.float32)}


# The NumPy oracle of the ranges: output channel ranges of the first layer, input channel ranges of the
# second, written out per layer kind.
def _out_ranges(w: np.ndarray, kind: str) -> np.ndarray:
    if kind == "gemm":  # fc1: B [K, N], output channels on axis 1
        return np.abs(w).max(axis=0)
    return np.abs(w).reshape(w.shape[0], -1).max(axis=1)  # conv / depthwise: axis 0


def _in_ranges(w: np.ndarray, kind: str) -> np.ndarray:
    if kind == "gemm_t":  # fc2: B [N, K] (transB), input channels on axis 1
        return np.abs(w).max(axis=0)
    if kind == "depthwise":  # [C, 1, k, k]: input channel c is output channel c
        return np.abs(w).reshape(w.shape[0], -1).max(axis=1)
    return np.abs(w).transpose(1, 0, 2, 3).reshape(w.shape[1], -1).max(axis=1)


PAIRS = [("c1.w", "conv", "dw.w", "depthwise"), ("dw.w", "depthwise", "c3.w", "conv"),
         ("c3.w", "conv", "c4.w", "conv"), ("fc1.w", "gemm", "fc2.w", "gemm_t")]


@pytest.mark.parametrize("seed", range(3))
def test_the_fp32_function_is_unchanged_and_the_ranges_balance(seed):
    model = mr.conv_chain(seed, spread=2.0)
    result = equalize(model)
    assert [(p.first, p.second, p.activation) for p in result.equalization.pairs] == [
        ("c1", "dw", "Relu"), ("fc1", "fc2", "Relu"), ("dw", "c3", "Relu"), ("c3", "c4", "LeakyRelu+MaxPool")]
    feed = _feed(np.random.default_rng(seed + 10))
    before, after = _run(model, feed), _run(result.model.proto, feed)
    for name in before:
        assert np.abs(after[name] - before[name]).max() <= 1e-5 * np.abs(before[name]).max()
    weights, original = _inits(result.model.proto), _inits(model)
    for first, kind1, second, kind2 in PAIRS:
        r1, r2 = _out_ranges(weights[first], kind1), _in_ranges(weights[second], kind2)
        np.testing.assert_allclose(r1 / r1.max(), r2 / r2.max(), rtol=1e-4)
        o1, o2 = _out_ranges(original[first], kind1), _in_ranges(original[second], kind2)
        assert (o1 / o2).max() / (o1 / o2).min() > 2.0  # they were far from balanced
    assert all(p.imbalance_before > 2.0 and p.imbalance_after < 1.0 + 1e-4 for p in result.equalization.pairs)
    assert [n.name for n in result.model.proto.graph.node] == [n.name for n in model.graph.node]
    assert set(weights) == set(original)  # the same initializer names: plans still apply


def test_equalizing_twice_changes_nothing():
    once = equalize(mr.conv_chain(0, spread=2.0))
    twice = equalize(once.model)
    assert twice.model is once.model and twice.equalization.pairs == ()


def test_bounded_activations_and_shared_tensors_are_not_crossed():
    model = mr.clipped_pair()
    result = equalize(model)
    assert result.equalization == Equalization((), 0)
    after, before = _inits(result.model.proto), _inits(model)
    assert after.keys() == before.keys() and all(np.array_equal(after[k], before[k]) for k in before)


def test_a_relu6_is_crossed_with_its_ceiling_rescaled_per_channel(rng):
    model = mr.relu6_chain()
    result = equalize(model)
    (pair,) = result.equalization.pairs  # Clip(-1, 6) has a floor that would need rescaling too: not crossed
    assert (pair.first, pair.second, pair.activation) == ("a", "b", "Clip")
    feed = {"x": rng.standard_normal((4, 3, 8, 8)).astype(np.float32) * 3}
    before, after = _run(model, feed)["y"], _run(result.model.proto, feed)["y"]
    assert np.abs(after - before).max() <= 1e-5 * np.abs(before).max()
    nodes = {n.name: n for n in result.model.proto.graph.node}
    weights, original = _inits(result.model.proto), _inits(model)
    scale = _out_ranges(original["a.w"], "conv") / _out_ranges(weights["a.w"], "conv")  # s per channel
    relu6, ceiling = nodes["relu6"], nodes["relu6/Min"]
    assert list(relu6.input) == ["t0", "zero", ""] and list(ceiling.output) == ["t1"]  # t1 keeps its name
    np.testing.assert_allclose(weights[ceiling.input[1]].reshape(-1), 6.0 / scale, rtol=1e-5)
    assert equalize(result.model).model is result.model


def test_int8_gains_on_unbalanced_channels(rng):
    model = mr.conv_chain(0, spread=2.0)
    calib, evals = _feed(rng, 32), _feed(rng, 16)
    fp = _run(model, evals)

    def sqnr(qmodel) -> float:
        out = _run(qmodel.model, evals)["y"]
        return 10 * np.log10((fp["y"] ** 2).sum() / ((out - fp["y"]) ** 2).sum())

    plain = sqnr(quantize(model, calib, CalibConfig("minmax")))
    equalized = sqnr(quantize(model, calib, CalibConfig("minmax", equalize=True)))
    assert equalized > plain + 6.0  # a quarter of the noise power, at least


def test_calibrate_and_insert_agree_with_quantize_and_fallback_keeps_names(rng):
    model, calib = mr.conv_chain(1, spread=2.0), _feed(rng, 8)
    config = CalibConfig("minmax", equalize=True)
    whole = quantize(model, calib, config)
    result = calibrate(model, calib, config)
    assert [p.first for p in result.equalization.pairs] == ["c1", "fc1", "dw", "c3"]
    parts = insert_qdq(model, result)  # the original model: insert_qdq equalizes it as calibrate did
    assert parts.model.SerializeToString() == whole.model.SerializeToString()
    mixed = remove_qdq(whole, ["c3"])
    assert "c3" in mixed.excluded
    assert {n.name for n in model.graph.node} <= {n.name for n in mixed.model.graph.node}
    again = type(result).from_dict(json.loads(json.dumps(result.to_dict(), allow_nan=False)))
    assert again.equalization == result.equalization
