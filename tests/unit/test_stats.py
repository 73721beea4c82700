"""Collectors and collect_stats: NumPy oracles, batching invariance, errors, JSON round trip."""
from __future__ import annotations

import json
import math
import warnings

import models
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

from quantdbg.calibration import stats as S
from quantdbg.data import ArrayData
from quantdbg.errors import BackendError, DataError, ModelError, NotCalibratedError


def _opts() -> ort.SessionOptions:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    return options


def _mlp_reference(model: onnx.ModelProto, x: np.ndarray) -> dict[str, np.ndarray]:
    """NumPy forward pass of tests.models.mlp: the oracle for its intermediate tensors."""
    w = {init.name: numpy_helper.to_array(init) for init in model.graph.initializer}
    h = x @ w["fc1.w"].T + w["fc1.b"]
    r = np.maximum(h, 0)
    return {"x": x, "h": h, "r": r, "m": r @ w["fc2.w"]}


def _collect_all(values: np.ndarray, sizes: list[int], num_bins: int = 256) -> S.TensorStats:
    collector = S.TensorCollector("t", histogram=True, num_bins=num_bins)
    for piece in np.split(values, np.cumsum(sizes)[:-1]):
        collector.update(piece)
    return collector.result()


def test_collector_matches_numpy_oracle(rng):
    x = rng.standard_normal(5000).astype(np.float32) * 3
    x[[10, 20, 30]] = [np.nan, np.inf, -np.inf]
    s = _collect_all(x, [5000])
    finite = x[np.isfinite(x)]
    assert (s.min, s.max, s.count, s.nonfinite) == (finite.min(), finite.max(), finite.size, 3)
    assert s.hist_range == 2.0 ** math.ceil(math.log2(np.abs(finite).max()))
    expected, _ = np.histogram(np.abs(finite), bins=256 * S.HIST_OVERSAMPLE, range=(0, s.hist_range))
    np.testing.assert_array_equal(s.hist, expected)


def test_stats_identical_for_any_batching_and_order(rng):
    x = np.concatenate([rng.standard_normal(3000) * 0.01, rng.standard_normal(300) * 40,
                        [0.0, -0.0, np.nan]]).astype(np.float32)
    reference = _collect_all(x, [x.size])
    for sizes in ([1] * 40 + [x.size - 40], [7] * 400 + [x.size - 2800], [64] * 51 + [x.size - 3264]):
        shuffled = x[rng.permutation(x.size)]
        assert _collect_all(shuffled, sizes) == reference


def test_all_zero_tensor_has_defined_stats():
    collector = S.TensorCollector("zeros", histogram=True, num_bins=128)
    collector.update(np.zeros((4, 8), np.float32))
    collector.update(-np.zeros(3, np.float32))
    s = collector.result()
    assert (s.min, s.max, s.absmax, s.count) == (0.0, 0.0, 0.0, 35)
    assert math.copysign(1.0, s.min) == 1.0  # no -0.0 leaks out
    assert s.hist[0] == 35 and s.hist_range == 2.0**-200
    assert s.binned(128).counts.tolist() == [35]


def test_binned_regroups_exactly_and_keeps_resolution(rng):
    x = (rng.standard_normal(20_000) * 7).astype(np.float32)
    s = _collect_all(x, [x.size], num_bins=2048)
    binned = s.binned(2048)
    assert 2048 * 8 // 9 <= binned.counts.size <= 2048
    assert binned.counts.sum() == x.size
    assert binned.edges[-2] <= np.abs(x).max() < binned.edges[-1]  # last bin holds max|x|
    expected, _ = np.histogram(np.abs(x), bins=binned.edges)  # oracle on the raw values
    np.testing.assert_array_equal(binned.counts, expected)


def test_binned_without_histogram_raises():
    s = S.TensorStats("t", -1.0, 1.0, 10)
    with pytest.raises(NotCalibratedError, match="'t' has no histogram"):
        s.binned(2048)


def test_tensor_stats_json_round_trip(rng):
    s = _collect_all(rng.standard_normal(1000).astype(np.float32), [1000])
    for original in (s, S.TensorStats("plain", -2.5, 3.0, 7, 1)):
        again = S.TensorStats.from_dict(json.loads(json.dumps(original.to_dict())))
        assert again == original


def test_merge_stats_equals_collecting_everything(rng):
    a = (rng.standard_normal(2000) * 0.3).astype(np.float32)
    b = (rng.standard_normal(500) * 50).astype(np.float32)
    merged = S.merge_stats("t", [_collect_all(a, [a.size]), _collect_all(b, [b.size])])
    assert merged == _collect_all(np.concatenate([a, b]), [a.size + b.size])


def test_collect_stats_matches_numpy_forward_pass(rng):
    model = models.mlp()
    x = rng.standard_normal((40, 8)).astype(np.float32)
    reference = _mlp_reference(model, x)
    stats = S.collect_stats(model, ArrayData({"x": x}, batch_size=6), ["x", "h", "r", "m"],
                            histogram={"h"}, num_bins=128, session_options=_opts())
    assert list(stats) == ["x", "h", "r", "m"]
    for name, values in reference.items():
        assert stats[name].min == pytest.approx(values.min(), rel=1e-5)
        assert stats[name].max == pytest.approx(values.max(), rel=1e-5)
        assert stats[name].count == values.size
    assert stats["h"].hist is not None and stats["r"].hist is None
    assert stats["x"].min == x.min()  # graph input: taken from the feed itself


def test_collect_sees_each_batch_once_in_order(rng):
    model = models.conv_relu()
    feeds = [{"x": np.full((i + 1, 3, 8, 8), float(i), np.float32)} for i in range(5)]
    seen: list[float] = []

    class Recording:
        def __iter__(self):
            for feed in feeds:
                seen.append(float(feed["x"][0, 0, 0, 0]))
                yield feed

    got = S.collect_stats(models.conv_relu(), Recording(), ["x"], max_batches=3, session_options=_opts())
    assert seen == [0.0, 1.0, 2.0]  # the fourth feed is never pulled
    assert (got.n_batches, got.n_samples) == (3, 1 + 2 + 3)
    assert got["x"].max == 2.0 and list(got) == ["x"]
    assert model == models.conv_relu()


def test_collect_does_not_modify_the_model(rng):
    model = models.conv_residual()
    before = model.SerializeToString()
    S.collect_stats(model, [{"x": rng.standard_normal((2, 4, 8, 8)).astype(np.float32)}], ["r1", "c2"],
                    session_options=_opts())
    assert model.SerializeToString() == before


def test_expose_tensors_adds_only_missing_outputs():
    model = models.conv_residual()
    exposed = S.expose_tensors(model, ["x", "r1", "y", "c2", "r1"])
    assert [o.name for o in exposed.graph.output] == ["y", "r1", "c2"]
    assert [o.name for o in model.graph.output] == ["y"]


def test_unknown_tensor_suggests_close_names(rng):
    with pytest.raises(ModelError, match=r"No tensor named 'summ'.*Did you mean 'sum'"):
        S.collect_stats(models.conv_residual(), [{"x": np.zeros((1, 4, 8, 8), np.float32)}], ["summ"])


def test_weight_is_refused():
    with pytest.raises(ModelError, match="'conv1.w' is an initializer"):
        S.collect_stats(models.conv_residual(), [{"x": np.zeros((1, 4, 8, 8), np.float32)}], ["conv1.w"])


def test_bad_feed_names_the_batch():
    feeds = [{"x": np.zeros((1, 4, 8, 8), np.float32)}] * 2 + [{"x": np.zeros((1, 4, 8, 8), np.float64)}]
    with pytest.raises(DataError, match="calibration batch 2: input 'x' expects dtype float32"):
        S.collect_stats(models.conv_residual(), feeds, ["r1"], session_options=_opts())


def test_empty_data_is_an_error():
    class Empty:
        def __iter__(self):
            return iter(())

    with pytest.raises(DataError, match="no batches"):
        S.collect_stats(models.conv_residual(), Empty(), ["r1"])


def _reshape_to_two_rows() -> onnx.ModelProto:
    """x[N,4] -> Reshape to (2, 4) -> Relu: valid for N = 2 only, which ONNX Runtime finds at run time."""
    h = onnx.helper
    graph = h.make_graph(
        [h.make_node("Reshape", ["x", "shape"], ["r"], name="reshape"),
         h.make_node("Relu", ["r"], ["y"], name="relu")],
        "reshape", [h.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["N", 4])],
        [h.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2, 4])],
        [numpy_helper.from_array(np.array([2, 4], np.int64), "shape")])
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 17)], ir_version=8)


def test_runtime_failure_names_the_batch():
    feeds = [{"x": np.zeros((2, 4), np.float32)}, {"x": np.zeros((3, 4), np.float32)}]
    with pytest.raises(BackendError, match="ONNX Runtime failed on calibration batch 1"):
        S.collect_stats(_reshape_to_two_rows(), feeds, ["r"], session_options=_opts())


def test_nonfinite_counts_are_warned(rng):
    x = rng.standard_normal((2, 3, 8, 8)).astype(np.float32)
    x[0, 0, 0, :3] = [np.nan, np.inf, -np.inf]
    stats = S.collect_stats(models.conv_relu(), [{"x": x}], ["x"], session_options=_opts())
    assert stats["x"].nonfinite == 3 and stats["x"].count == x.size - 3
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        S.warn_nonfinite(stats)
    assert [str(w.message) for w in caught] == [
        f"Tensor 'x': 3 NaN/Inf value(s) out of {x.size} were left out of its statistics. "
        "Check the model and the calibration data."]


def test_integer_tensor_is_refused():
    collector = S.TensorCollector("ids")
    with pytest.raises(DataError, match="'ids' holds int64 values"):
        collector.update(np.arange(4))
