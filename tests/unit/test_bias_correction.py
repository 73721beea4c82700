"""Bias correction: the planted rounding shift against a NumPy oracle, where each bias goes, fallback undoing
it, the switchable graph, batch invariance, external weights and the JSON forms."""
from __future__ import annotations

import json

import export_forms
import models_repairs as mr
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

from quantdbg.calibration import BiasCorrections, CalibrationResult, calibrate, correct_biases
from quantdbg.calibration.collect import expose_tensors
from quantdbg.calibration.ranges import recalibrate
from quantdbg.config import CalibConfig, Precision
from quantdbg.data import as_model_data
from quantdbg.errors import ModelError, NotCalibratedError
from quantdbg.model import load_model
from quantdbg.model.load import as_loaded
from quantdbg.placement import plan_qdq
from quantdbg.qdq import insert_qdq, quantize, remove_qdq
from quantdbg.quant_math import QMAX
from quantdbg.sensitivity.graphs import switch_graph

BIASED = CalibConfig("minmax", bias_correction=True)


def _run(model: onnx.ModelProto, feed: dict[str, np.ndarray], names: list[str]) -> dict[str, np.ndarray]:
    """Outputs ``names`` with ONNX Runtime's graph optimizations off: Q/DQ run as ONNX defines them."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(expose_tensors(model, names).SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    return dict(zip(names, session.run(names, feed), strict=True))


def _inits(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    return {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}


def _node(model: onnx.ModelProto, name: str) -> onnx.NodeProto:
    return next(n for n in model.graph.node if n.name == name)


@pytest.fixture
def data(rng):
    """Inputs with a non-zero mean, so the rounding shift of the weights shifts the outputs."""
    return {"x": (rng.standard_normal((24, 3, 6, 6)) + 1.0).astype(np.float32),
            "z": (rng.standard_normal((24, 12)) + 0.5).astype(np.float32)}


# ----- the NumPy oracle ---------------------------------------------------------------------------

def _rounding_error(w: np.ndarray, axis: int) -> np.ndarray:
    """DQ(Q(w)) - w for symmetric per-channel INT8 along ``axis``, in float64 (written out here)."""
    w64 = np.asarray(w, np.float64)
    keep = tuple(a for a in range(w.ndim) if a != axis)
    step = np.abs(w).max(axis=keep, keepdims=True).astype(np.float32).astype(np.float64) / QMAX
    step = step.astype(np.float32).astype(np.float64)
    return np.clip(np.round(w64 / step), -QMAX, QMAX) * step - w64


def _conv_mean(x: np.ndarray, delta: np.ndarray, pad: int) -> np.ndarray:
    """Per-output-channel mean of conv(x, delta) (stride 1), by explicit windows."""
    k = delta.shape[-1]
    xp = np.pad(np.asarray(x, np.float64), ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    out_h = xp.shape[2] - k + 1
    out = np.stack([np.einsum("nckl,ockl->no", xp[:, :, i:i + k, j:j + k], delta)
                    for i in range(out_h) for j in range(out_h)])
    return out.mean(axis=(0, 1))


def _oracle(data: dict[str, np.ndarray], fp: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    w = mr.shifted_weights()
    return {"conv": _conv_mean(data["x"], _rounding_error(w["conv.w"], 0), 1),
            "nob": _conv_mean(fp["t0"], _rounding_error(w["nob.w"], 0), 0),
            "fc": (data["z"].astype(np.float64) @ _rounding_error(w["fc.w"], 0).T).mean(axis=0),
            "mm": (fp["f"].astype(np.float64) @ _rounding_error(w["mm.w"], 1)).mean(axis=0)}


def test_the_planted_rounding_shift_matches_the_numpy_oracle(data):
    model = mr.shifted_layers()
    fp = _run(model, data, ["t0", "f"])
    result = calibrate(model, data, BIASED)
    found = result.bias_correction
    assert [c.node for c in found.corrections] == ["conv", "fc", "nob", "mm"]
    expected = _oracle(data, fp)
    for c in found.corrections:
        np.testing.assert_allclose(c.shift, expected[c.node], rtol=1e-5, atol=1e-7)
        assert np.all(c.shift < 0)  # +0.4 step off the grid: rounding pulls every channel down
    assert [(s.node, s.reason) for s in found.skipped] == [
        ("bare", "a MatMul without a bias Add (a new Add node would change the graph TensorRT fuses)")]
    assert (found.n_batches, found.n_samples) == (result.n_batches, result.n_samples) == (1, 24)


def test_each_bias_goes_where_the_layer_reads_it(data):
    model = mr.shifted_layers()
    w = mr.shifted_weights()
    qmodel = quantize(model, data, BIASED)
    found = qmodel.calibration.bias_correction
    inits = _inits(qmodel.model)
    by_node = {c.node: c for c in found.corrections}
    expected = {"conv": ("conv", 2, "conv.b", "initializer", w["conv.b"]),
                "nob": ("nob", 2, "", "none", np.zeros(4, np.float32)),
                "fc": ("fc", 2, "fc.b", "initializer", w["fc.b"]),
                "mm": ("mm_bias", 1, "mm.b", "initializer", w["mm.b"])}
    for layer, (owner, index, bias, held, original) in expected.items():
        c = by_node[layer]
        assert (c.owner, c.input_index, c.bias, c.held) == (owner, index, bias, held)
        written = inits[_node(qmodel.model, owner).input[index]]
        np.testing.assert_allclose(written, original - c.shift, rtol=0, atol=1e-6)
        np.testing.assert_array_equal(written, c.corrected)
    assert len(_node(qmodel.model, "bare").input) == 2  # skipped: no Add was made


def test_the_corrected_model_loses_the_mean_error_of_its_weights(data):
    """Output mean error vs FP32, per channel, where every layer before the output is corrected: the
    planted shift is gone (what is left comes from rounding the activations, which the correction
    does not cover)."""
    model = mr.shifted_layers()
    fp = _run(model, data, ["t0", "y", "f", "h"])
    plain, corrected = quantize(model, data, CalibConfig("minmax")), quantize(model, data, BIASED)
    for tensor, axis in (("t0", 1), ("y", 1), ("f", 1), ("h", 1)):
        reduce = tuple(a for a in range(fp[tensor].ndim) if a != axis)
        before = np.abs((_run(plain.model, data, [tensor])[tensor] - fp[tensor]).mean(axis=reduce))
        after = np.abs((_run(corrected.model, data, [tensor])[tensor] - fp[tensor]).mean(axis=reduce))
        assert np.linalg.norm(after) < 0.25 * np.linalg.norm(before), tensor


def test_a_bias_held_by_a_constant_node_becomes_an_initializer(data):
    model = mr.shifted_layers()
    graph = model.graph
    bias = next(i for i in graph.initializer if i.name == "conv.b")
    graph.node.insert(0, onnx.helper.make_node("Constant", [], ["conv.b_c"], name="bias_const", value=bias))
    _node(model, "conv").input[2] = "conv.b_c"
    graph.initializer.remove(bias)
    qmodel = quantize(model, data, BIASED)
    c = qmodel.calibration.bias_correction.of("conv")
    assert (c.bias, c.held) == ("conv.b_c", "computed")
    written = _inits(qmodel.model)[_node(qmodel.model, "conv").input[2]]
    np.testing.assert_allclose(written, mr.shifted_weights()["conv.b"] - c.shift, atol=1e-6)


@pytest.mark.parametrize("form", ["constants", "transposed", "inputs"])
def test_weights_and_biases_wherever_the_export_holds_them(form, data):
    """Weights in Constant nodes or behind a Transpose, biases in Constant nodes: the same corrections,
    and each corrected bias written as an initializer the layer reads."""
    plain = calibrate(mr.shifted_layers(), data, BIASED).bias_correction
    qmodel = quantize(export_forms.form(mr.shifted_layers(), form), data, BIASED)
    found = qmodel.calibration.bias_correction
    assert [c.node for c in found.corrections] == [c.node for c in plain.corrections]
    for a, b in zip(found.corrections, plain.corrections, strict=True):
        np.testing.assert_allclose(a.shift, b.shift, rtol=1e-6, atol=1e-9)
        assert a.held == ("computed" if form == "constants" and b.held == "initializer" else b.held)
        written = _inits(qmodel.model)[_node(qmodel.model, a.owner).input[a.input_index]]
        np.testing.assert_array_equal(written, a.corrected)


def test_the_shift_does_not_depend_on_the_batch_size(data):
    loaded = as_loaded(mr.shifted_layers())
    plan = plan_qdq(loaded)
    found = [correct_biases(loaded, as_model_data(data, loaded.proto, size), plan) for size in (1, 5, 24)]
    for other in found[1:]:
        for a, b in zip(found[0].corrections, other.corrections, strict=True):
            np.testing.assert_allclose(a.shift, b.shift, rtol=1e-6, atol=1e-9)
    assert [f.n_batches for f in found] == [24, 5, 1]


def test_weights_in_a_data_file_give_the_same_corrections(tmp_path, data):
    path = tmp_path / "shifted.onnx"
    onnx.save(mr.shifted_layers(), path, save_as_external_data=True, all_tensors_to_one_file=True,
              location="shifted.data", size_threshold=0)
    lazy, memory = as_loaded(load_model(path)), as_loaded(mr.shifted_layers())
    found = [correct_biases(m, data, plan_qdq(m)) for m in (lazy, memory)]
    assert found[0] == found[1]


# ----- fallback, exclusion and the switchable graph ----------------------------------------------

def test_a_layer_out_of_int8_computes_with_its_fp32_bias(data):
    model = mr.shifted_layers()
    fp = _run(model, data, ["y", "v"])
    qmodel = quantize(model, data, BIASED)
    mixed = remove_qdq(qmodel, qmodel.layers, Precision.FP32)
    out = _run(mixed.model, data, ["y", "v"])
    for name in ("y", "v"):
        np.testing.assert_allclose(out[name], fp[name], rtol=1e-5, atol=1e-5)
    assert len(_node(mixed.model, "nob").input) == 2  # the bias it did not have is gone again
    kept = insert_qdq(model, qmodel.calibration, exclude=["conv"])
    np.testing.assert_array_equal(_inits(kept.model)[_node(kept.model, "conv").input[2]],
                                  mr.shifted_weights()["conv.b"])


def test_switches_turn_the_corrected_biases_on_and_off(data):
    model = mr.shifted_layers()
    qmodel = quantize(model, data, BIASED)
    switch = switch_graph(qmodel, model)
    names = ["y", "v"]
    fp, int8 = _run(model, data, names), _run(qmodel.model, data, names)
    for quantized, expected in (((), fp), (qmodel.layers, int8)):
        out = _run(switch.model, {**data, **switch.feed(quantized)}, names)
        for name in names:
            np.testing.assert_allclose(out[name], expected[name], rtol=1e-5, atol=1e-5)


def test_corrections_of_another_model_are_refused(data):
    result = calibrate(mr.shifted_layers(), data, BIASED)
    other = mr.shifted_layers()
    _node(other, "fc").input[2] = "conv.b"  # a bias of another name where the correction goes
    message = (r"^The bias correction of layer 'fc' was measured with bias 'fc\.b' at input 2 of node 'fc', "
               r"which this model does not have \('conv\.b'\); calibrate this model again\.$")
    with pytest.raises(ModelError, match=message):
        insert_qdq(other, result)


def test_recalibrating_keeps_the_corrections_only_when_asked(data):
    model = mr.shifted_layers()
    plan = plan_qdq(as_loaded(model))
    result = calibrate(model, data, CalibConfig("entropy", bias_correction=True), plan)
    kept = recalibrate(result, BIASED, plan)
    assert kept.bias_correction == result.bias_correction and kept.ranges != result.ranges
    plain = recalibrate(result, CalibConfig("minmax"), plan)
    assert plain.bias_correction is None
    message = r"^The calibration holds no bias corrections, which the config asks for; calibrate again"
    with pytest.raises(NotCalibratedError, match=message):
        recalibrate(plain, BIASED, plan)
    message = r"^The calibration's statistics are of the model as given, but the config says equalize=True; "
    with pytest.raises(NotCalibratedError, match=message):
        recalibrate(result, CalibConfig("minmax", equalize=True), plan)


# ----- JSON ----------------------------------------------------------------------------------------

def test_config_and_result_round_trip_through_json(data):
    config = CalibConfig("minmax", bias_correction=True, equalize=True)
    form = json.loads(json.dumps(config.to_dict()))
    assert form["bias_correction"] is True and form["equalize"] is True
    assert CalibConfig.from_dict(form) == config
    assert "bias_correction" not in CalibConfig().to_dict()  # files written before keep their form
    result = calibrate(mr.shifted_layers(), data, BIASED)
    again = CalibrationResult.from_dict(json.loads(json.dumps(result.to_dict(), allow_nan=False)))
    assert again.bias_correction == result.bias_correction
    assert isinstance(again.bias_correction, BiasCorrections) and again == result
