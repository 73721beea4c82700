"""SmoothQuant-style smoothing: FP32 equivalence against NumPy oracles, the factors, the folds."""
from __future__ import annotations

import dataclasses
import json
import warnings

import models
import models_smoothing as ms
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

from quantdbg.calibration import SmoothingConfig, SmoothingResult, smooth
from quantdbg.calibration.smoothing.apply import apply_smoothing
from quantdbg.calibration.smoothing.measure import collect_channel_absmax
from quantdbg.calibration.smoothing.migrate import smoothing_scales
from quantdbg.calibration.smoothing.result import Migration
from quantdbg.config import CalibConfig, QuantConfig, TensorKind
from quantdbg.errors import ConfigError, DataError, FormatError, ModelError, QuantDbgWarning
from quantdbg.qdq import quantize


def _run(model: onnx.ModelProto, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, feed), strict=True))


def _inits(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    return {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}


def _oracle_scale(act: np.ndarray, weights: list[np.ndarray], alpha: float) -> np.ndarray:
    """SmoothQuant's s_j from activations [..., K] and weights [K, N], written out independently."""
    a = np.abs(act.reshape(-1, act.shape[-1])).max(axis=0)
    w = np.max([np.abs(wt).max(axis=1) for wt in weights], axis=0)
    return a**alpha / w ** (1 - alpha)


@pytest.fixture
def ffn_data(rng):
    return [{"x": rng.standard_normal((3, 5, 8), dtype=np.float32)} for _ in range(3)]


@pytest.fixture
def gemm_data(rng):
    return [{"x": rng.standard_normal((4, 8), dtype=np.float32) * 2} for _ in range(3)]


# ---------------------------------------------------------------------------------------------
# FP32 equivalence and placement
# ---------------------------------------------------------------------------------------------

def test_layernorm_and_constant_folds_keep_outputs(rng, ffn_data):
    result = smooth(ms.ln_ffn(), ffn_data, SmoothingConfig(alpha=0.5))
    placements = {m.tensor: (m.placement, m.folded_into, m.nodes) for m in result.migrations}
    assert all(m.smoothed_tensor == m.tensor for m in result.migrations)  # folded: names kept
    assert placements == {"ln": ("layernorm", "ln", ("q", "k", "up")),
                          "g": ("scale_constant", "half", ("down",))}
    assert [n.op_type for n in result.model.graph.node].count("Mul") == 1  # nothing inserted
    x = rng.standard_normal((2, 5, 8), dtype=np.float32)
    got = _run(result.model, {"x": x})
    want = ms.ln_ffn_forward(x)
    np.testing.assert_allclose(got["d"], want["d"], rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(got["att"], want["att"], rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(got["ln_shape"], [2, 5, 8])


def test_explicit_mul_bias_and_matmul_folds_keep_outputs(rng, gemm_data):
    result = smooth(ms.residual_gemm(), gemm_data, SmoothingConfig(alpha=0.7))
    placements = {m.tensor: (m.placement, m.folded_into) for m in result.migrations}
    assert {t: p for t, (p, _) in placements.items()} == {
        "ln": "explicit_mul", "a": "bias_matmul", "r": "explicit_mul", "x": "explicit_mul", "z": "matmul"}
    assert placements["a"][1] == "m1_bias" and placements["z"][1] == "zx"
    x = rng.standard_normal((6, 8), dtype=np.float32) * 2
    got = _run(result.model, {"x": x})
    want = ms.residual_gemm_forward(x)
    np.testing.assert_allclose(got["y"], want["y"], rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(got["t"], want["t"], rtol=1e-4, atol=1e-4)


def test_fold_false_puts_an_explicit_mul_before_every_smoothed_node(rng, ffn_data):
    result = smooth(ms.ln_ffn(), ffn_data, SmoothingConfig(fold=False))
    assert {m.placement for m in result.migrations} == {"explicit_mul"}
    producers = {o: n for n in result.model.graph.node for o in n.output}
    inits = _inits(result.model)
    for migration in result.migrations:
        for name in migration.nodes:
            node = next(n for n in result.model.graph.node if n.name == name)
            mul = producers[node.input[0]]
            assert mul.op_type == "Mul" and mul.name == migration.folded_into
            assert mul.input[0] == migration.tensor  # the original tensor, untouched for other readers
            assert node.input[0] == migration.smoothed_tensor
            assert inits[mul.input[1]].shape == (migration.channels,)
    x = rng.standard_normal((2, 5, 8), dtype=np.float32)
    np.testing.assert_allclose(_run(result.model, {"x": x})["d"], ms.ln_ffn_forward(x)["d"],
                               rtol=1e-4, atol=1e-4)


def test_shared_initializer_is_copied_not_overwritten(rng):
    data = [{"x": rng.standard_normal((4, 6), dtype=np.float32)}]
    result = smooth(ms.shared_weight(), data)
    assert len(result.migrations) == 2
    x = rng.standard_normal((3, 6), dtype=np.float32)
    weight = _inits(ms.shared_weight())["w"].astype(np.float64)
    want = np.maximum(x @ weight, 0) @ weight
    np.testing.assert_allclose(_run(result.model, {"x": x})["y"], want, rtol=1e-4, atol=1e-5)


def test_caller_model_is_not_modified(ffn_data):
    model = ms.ln_ffn()
    before = model.SerializeToString()
    smooth(model, ffn_data)
    assert model.SerializeToString() == before


# ---------------------------------------------------------------------------------------------
# The factors against NumPy
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("alpha", [0.0, 0.5, 0.85, 1.0])
def test_weights_and_gamma_follow_numpy_smoothquant_factors(ffn_data, alpha):
    result = smooth(ms.ln_ffn(), ffn_data, SmoothingConfig(alpha=alpha))
    x = np.concatenate([f["x"] for f in ffn_data])
    acts = ms.ln_ffn_forward(x)
    w = ms.ln_ffn_weights()
    s_ln = _oracle_scale(acts["ln"], [w["wq"], w["wk"], w["wup"]], alpha)
    s_g = _oracle_scale(acts["g"], [w["wd"]], alpha)
    got = _inits(result.model)
    for name in ("wq", "wk", "wup"):
        np.testing.assert_allclose(got[name], w[name] * s_ln[:, None], rtol=1e-5)
    np.testing.assert_allclose(got["ln.gamma"], w["ln.gamma"] / s_ln, rtol=1e-5)
    np.testing.assert_allclose(got["ln.beta"], w["ln.beta"] / s_ln, rtol=1e-5)
    np.testing.assert_allclose(got["wd"], w["wd"] * s_g[:, None], rtol=1e-5)
    half = next(n for n in result.model.graph.node if n.name == "half")
    np.testing.assert_allclose(got[half.input[1]].ravel(), 0.5 / s_g, rtol=1e-5)
    ln = result.migration_of("k")
    assert ln.scale_max == pytest.approx(s_ln.max(), rel=1e-5)
    rows = np.max([np.abs(w[n]).max(axis=1) for n in ("wq", "wk", "wup")], axis=0)
    assert ln.weight_outlier_before == pytest.approx(rows.max() / np.median(rows), rel=1e-5)
    assert ln.weight_outlier_after == pytest.approx((rows * s_ln).max() / np.median(rows * s_ln), rel=1e-5)
    assert ln.act_absmax_after == pytest.approx((np.abs(acts["ln"]).max(axis=(0, 1)) / s_ln).max(), rel=1e-5)


def test_gemm_transb_scales_columns_of_b(gemm_data):
    result = smooth(ms.residual_gemm(), gemm_data, SmoothingConfig(alpha=0.5))
    x = np.concatenate([f["x"] for f in gemm_data])
    w = ms.residual_gemm_weights()
    s_r = _oracle_scale(ms.residual_gemm_forward(x)["r"], [w["gb"].T], 0.5)
    np.testing.assert_allclose(_inits(result.model)["gb"], w["gb"] * s_r[None, :], rtol=1e-5)


def test_smoothing_scales_guard_zero_channels_and_clip():
    s = smoothing_scales(np.array([4.0, 0.0, 1e12, 1.0]), np.array([1.0, 2.0, 1.0, 0.0]), 0.5,
                         max_scale=100.0)
    np.testing.assert_allclose(s, [2.0, 1.0, 100.0, 1.0])
    with pytest.raises(ModelError, match=r"cover \(2,\) channels but the weights have \(3,\)"):
        smoothing_scales(np.ones(2), np.ones(3), 0.5)


def test_channel_absmax_is_batch_invariant_and_matches_numpy(rng):
    x = rng.standard_normal((13, 5, 8), dtype=np.float32)
    want = np.abs(ms.ln_ffn_forward(x)["g"]).max(axis=(0, 1))
    results = [collect_channel_absmax(ms.ln_ffn(), {"x": x[order]} if bs is None else
                                      [{"x": x[order][i:i + bs]} for i in range(0, 13, bs)], ["g", "x"])
               for bs, order in ((1, np.arange(13)), (7, rng.permutation(13)), (None, np.arange(13)))]
    for got in results:
        np.testing.assert_array_equal(got.absmax["g"], results[0].absmax["g"])
        np.testing.assert_array_equal(got.absmax["x"], np.abs(x).max(axis=(0, 1)))
        assert got.n_samples == 13
    np.testing.assert_allclose(results[0].absmax["g"], want, rtol=1e-5)
    assert [r.n_batches for r in results] == [13, 2, 1]


def test_nonfinite_values_are_counted_left_out_and_warned(rng):
    x = np.abs(rng.standard_normal((6, 4), dtype=np.float32)) + 0.5
    x[1, :2] = [0.0, -1.0]  # finite inputs; Log makes them -inf and NaN
    with pytest.warns(QuantDbgWarning, match=r"Tensor 'l': 2 NaN/Inf value\(s\)"):
        got = collect_channel_absmax(models.log_matmul(), [{"x": x}], ["l"])
    logs = np.log(np.where(x > 0, x, np.nan))
    want = np.nanmax(np.abs(logs), axis=0)
    np.testing.assert_allclose(got.absmax["l"], want, rtol=1e-6)
    assert got.nonfinite["l"] == 2


# ---------------------------------------------------------------------------------------------
# Selection, skipping, errors
# ---------------------------------------------------------------------------------------------

def test_activation_products_are_skipped_with_reason(ffn_data):
    result = smooth(ms.ln_ffn(), ffn_data)
    assert [s.node for s in result.skipped] == ["att"]
    assert "input 1 ('kt') is not an initializer" in result.skipped[0].reason


def test_partial_selection_of_readers_falls_back_to_explicit_mul(rng, ffn_data):
    result = smooth(ms.ln_ffn(), ffn_data, SmoothingConfig(nodes=("q", "up", "down"), exclude=("up",)))
    by_tensor = {m.tensor: m for m in result.migrations}
    assert by_tensor["ln"].nodes == ("q",) and by_tensor["ln"].placement == "explicit_mul"
    inits = _inits(result.model)
    np.testing.assert_array_equal(inits["wk"], ms.ln_ffn_weights()["wk"])  # k untouched
    x = rng.standard_normal((2, 5, 8), dtype=np.float32)
    np.testing.assert_allclose(_run(result.model, {"x": x})["att"], ms.ln_ffn_forward(x)["att"],
                               rtol=1e-4, atol=1e-4)


def test_unknown_node_glob_names_close_matches(ffn_data):
    with pytest.raises(ModelError, match=r"SmoothingConfig.nodes entry 'dwn' matches no node.*'down'"):
        smooth(ms.ln_ffn(), ffn_data, SmoothingConfig(nodes=("dwn",)))


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"alpha": 1.5}, r"alpha must be in \[0, 1\], got 1.5"),
    ({"op_types": ("Conv",)}, r"op_types must be a non-empty subset of \('MatMul', 'Gemm'\)"),
    ({"nodes": "q"}, r"nodes takes a sequence of strings, not one string \('q'\)"),
    ({"max_scale": 0.5}, r"max_scale must be >= 1, got 0.5"),
    ({"max_batches": 0}, r"max_batches must be >= 1 or None, got 0"),
])
def test_config_validation(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        SmoothingConfig(**kwargs)


def test_apply_smoothing_needs_every_range():
    with pytest.raises(DataError, match=r"No per-channel range for activation 'g' \(read by 'down'\)"):
        apply_smoothing(ms.ln_ffn(), {"ln": np.ones(8)})
    with pytest.raises(ModelError, match=r"range of activation 'ln' has shape \(5,\), but node 'q' has 8"):
        apply_smoothing(ms.ln_ffn(), {"ln": np.ones(5), "g": np.ones(16)})


def test_weights_are_refused_as_measured_tensors():
    with pytest.raises(ModelError, match=r"Tensor 'wq' is an initializer"):
        collect_channel_absmax(ms.ln_ffn(), [{"x": np.ones((1, 5, 8), np.float32)}], ["wq"])


def test_empty_data_is_an_error():
    with pytest.raises(DataError, match="calibration data yielded no"):
        collect_channel_absmax(ms.ln_ffn(), [], ["ln"])


# ---------------------------------------------------------------------------------------------
# Results and the next stage
# ---------------------------------------------------------------------------------------------

def test_result_json_round_trip(gemm_data):
    result = smooth(ms.residual_gemm(), gemm_data, SmoothingConfig(alpha=0.8, exclude=("zt",)))
    data = json.loads(json.dumps(result.to_dict()))
    back = SmoothingResult.from_dict(data, result.model)
    assert back == result and back.to_dict() == result.to_dict()
    assert back.n_batches == 3 and back.n_samples == 12
    assert Migration.from_dict(data["migrations"][0]) == result.migrations[0]
    assert SmoothingConfig.from_dict(result.config.to_dict()) == result.config
    assert list(data) == ["migrations", "skipped", "config", "n_batches", "n_samples"]  # no model bytes
    assert data["config"] == {"alpha": 0.8, "op_types": ["MatMul", "Gemm"], "nodes": ["*"], "exclude": ["zt"],
                              "fold": True, "max_scale": 1e4, "max_batches": None}
    assert list(data["migrations"][0]) == [f.name for f in dataclasses.fields(Migration)]
    data["migrations"][1]["placement"] = "upstream"
    with pytest.raises(FormatError) as err:
        SmoothingResult.from_dict(data, result.model, "smoothing.json")
    assert str(err.value).startswith("smoothing.json: not a valid SmoothingResult: field "
                                     "'migrations[1].placement': expected one of \"layernorm\"")


def test_smoothed_model_quantizes_with_every_matmul_input_dequantized(gemm_data):
    result = smooth(ms.residual_gemm(), gemm_data)
    qmodel = quantize(result.model, gemm_data, CalibConfig("minmax"), QuantConfig())
    producers = {o: n for n in qmodel.model.graph.node for o in n.output}
    for name in result.nodes:
        node = next(n for n in qmodel.model.graph.node if n.name == name)
        assert producers[node.input[0]].op_type == "DequantizeLinear", name
    # The activation pair of an explicit-Mul group quantizes the Mul's output.
    mul = result.migration_of("head").folded_into
    record = next(r for r in qmodel.records_of("head") if r.kind is TensorKind.ACTIVATION)
    assert producers[record.tensor].name == mul
    assert record.tensor == result.migration_of("head").smoothed_tensor


@pytest.mark.slow
@pytest.mark.zoo
def test_minilm_smoothing_keeps_fp32_outputs(zoo_model):
    folder = zoo_model("minilm_l6_v2_text")
    with np.load(folder / "calib.npz") as npz:
        calib = {k: npz[k][:8] for k in npz.files}
    with np.load(folder / "eval.npz") as npz:
        feed = {k: npz[f"q_{k}"][:4] for k in ("input_ids", "attention_mask", "token_type_ids")}
    with warnings.catch_warnings():
        warnings.simplefilter("error", QuantDbgWarning)
        result = smooth(folder / "model.onnx", calib, SmoothingConfig(alpha=0.8), batch_size=4)
    assert len(result.nodes) == 36 and len(result.skipped) == 12  # 6 layers x (4 dense + Q/K/V), 12 attention
    ref = _run(onnx.load(str(folder / "model.onnx")), feed)
    got = _run(result.model, feed)
    for name, value in ref.items():
        np.testing.assert_allclose(got[name], value, rtol=1e-4, atol=1e-5)
