"""collect_stats and the ONNX Runtime pass behind it: NumPy forward-pass oracles, each batch seen once
and in order, the exposed outputs, and the errors naming the batch or tensor."""
from __future__ import annotations

import warnings

import models
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

from quantdbg.calibration.collect import (
    ActivationStream,
    CollectConfig,
    check_activations,
    collect_stats,
    expose_tensors,
    sample_axis_tensors,
    warn_nonfinite,
)
from quantdbg.data import ArrayData
from quantdbg.errors import BackendError, ConfigError, DataError, ModelError
from quantdbg.execution import LocalExecutor
from quantdbg.model import load_model


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


def test_collect_stats_matches_numpy_forward_pass(rng):
    model = models.mlp()
    x = rng.standard_normal((40, 8)).astype(np.float32)
    reference = _mlp_reference(model, x)
    stats = collect_stats(model, ArrayData({"x": x}, batch_size=6), ["x", "h", "r", "m"],
                            CollectConfig(histogram={"h"}, num_bins=128), session_options=_opts())
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

    got = collect_stats(models.conv_relu(), Recording(), ["x"], CollectConfig(max_batches=3),
                        session_options=_opts())
    assert seen == [0.0, 1.0, 2.0]  # the fourth feed is never pulled
    assert (got.n_batches, got.n_samples) == (3, 1 + 2 + 3)
    assert got["x"].max == 2.0 and list(got) == ["x"]
    assert model == models.conv_relu()


def test_collect_does_not_modify_the_model(rng):
    model = models.conv_residual()
    before = model.SerializeToString()
    collect_stats(model, [{"x": rng.standard_normal((2, 4, 8, 8)).astype(np.float32)}], ["r1", "c2"],
                    session_options=_opts())
    assert model.SerializeToString() == before


def test_expose_tensors_adds_only_missing_outputs():
    model = models.conv_residual()
    exposed = expose_tensors(model, ["x", "r1", "y", "c2", "r1"])
    assert [o.name for o in exposed.graph.output] == ["y", "r1", "c2"]
    assert [o.name for o in model.graph.output] == ["y"]


def test_unknown_tensor_suggests_close_names(rng):
    with pytest.raises(ModelError, match=r"No tensor named 'summ'.*Did you mean 'sum'"):
        collect_stats(models.conv_residual(), [{"x": np.zeros((1, 4, 8, 8), np.float32)}], ["summ"])


def test_weight_is_refused():
    with pytest.raises(ModelError, match="'conv1.w' is an initializer"):
        collect_stats(models.conv_residual(), [{"x": np.zeros((1, 4, 8, 8), np.float32)}], ["conv1.w"])


def test_bad_feed_names_the_batch():
    feeds = [{"x": np.zeros((1, 4, 8, 8), np.float32)}] * 2 + [{"x": np.zeros((1, 4, 8, 8), np.float64)}]
    with pytest.raises(DataError, match="calibration batch 2: input 'x' expects dtype float32"):
        collect_stats(models.conv_residual(), feeds, ["r1"], session_options=_opts())


def test_empty_data_is_an_error():
    class Empty:
        def __iter__(self):
            return iter(())

    with pytest.raises(DataError, match="no batches"):
        collect_stats(models.conv_residual(), Empty(), ["r1"])


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
        collect_stats(_reshape_to_two_rows(), feeds, ["r"], session_options=_opts())


def test_nonfinite_counts_are_warned(rng):
    x = np.abs(rng.standard_normal((2, 4))).astype(np.float32)
    x[0, :3] = [0.0, -1.0, 0.0]  # finite inputs; Log makes them -inf, NaN, -inf
    stats = collect_stats(models.log_matmul(), [{"x": x}], ["l"], session_options=_opts())
    assert stats["l"].nonfinite == 3 and stats["l"].count == x.size - 3
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warn_nonfinite(stats)
    assert [str(w.message) for w in caught] == [
        f"Tensor 'l': 3 NaN/Inf value(s) out of {x.size} were left out of its statistics. "
        "Check the model and the calibration data."]


def test_activation_stream_yields_each_batch_once_in_order(rng):
    model = models.mlp()
    xs = [rng.standard_normal((n, 8)).astype(np.float32) for n in (3, 1, 4)]
    stream = ActivationStream(model, ["r", "x", "h"], "calibration", _opts())
    seen = list(stream.batches([{"x": x} for x in xs]))
    assert (stream.n_batches, stream.n_samples) == (3, 8)
    for x, arrays in zip(xs, seen, strict=True):
        reference = _mlp_reference(model, x)
        assert list(arrays) == ["r", "x", "h"]
        assert np.array_equal(arrays["x"], x)  # a graph input comes from the feed itself
        for name in ("r", "h"):
            np.testing.assert_allclose(arrays[name], reference[name], rtol=1e-5, atol=1e-6)


def test_activation_stream_stops_at_max_batches_and_refuses_empty_data():
    feeds = [{"x": np.full((2, 8), float(i), np.float32)} for i in range(5)]
    stream = ActivationStream(models.mlp(), ["x"], "smoothing")
    assert [float(a["x"][0, 0]) for a in stream.batches(feeds, max_batches=2)] == [0.0, 1.0]
    assert (stream.n_batches, stream.n_samples) == (2, 4)

    class Empty:  # re-iterable, so it is used as is, and yields nothing
        def __iter__(self):
            return iter(())

    with pytest.raises(DataError, match="^The calibration data yielded no batches; give at least one feed.$"):
        list(ActivationStream(models.mlp(), ["x"], "smoothing").batches(Empty()))


def test_check_activations_names_the_initializer_and_suggests_close_names():
    model = models.mlp()
    check_activations(model, ["x", "h", "m"], "")
    with pytest.raises(ModelError) as err:
        check_activations(model, ["fc1.w"], "; not here.")
    assert str(err.value) == "Tensor 'fc1.w' is an initializer; not here."
    with pytest.raises(ModelError, match=r"^No tensor named 'hh' in the model\. Did you mean 'h'"):
        check_activations(model, ["hh"], "")


def test_collect_config_normalises_and_validates():
    assert CollectConfig(histogram=["a", "b", "a"]).histogram == frozenset({"a", "b"})
    assert CollectConfig(histogram=True).histogram is True
    with pytest.raises(ConfigError, match=r"not one string \('h'\); write \{'h'\}"):
        CollectConfig(histogram="h")
    with pytest.raises(ConfigError, match="^CollectConfig.num_bins must be an integer >= 1, got 0.$"):
        CollectConfig(num_bins=0)
    with pytest.raises(ConfigError, match="^CollectConfig.max_batches must be >= 1 or None, got 0.$"):
        CollectConfig(max_batches=0)


def _transposed() -> onnx.ModelProto:
    """x[N,8] -> Transpose -> t[8,N] -> Transpose -> y[N,8]: t's axis 0 is not the samples'."""
    import onnx_graphsurgeon as gs

    x, y = gs.Variable("x", np.float32, ("N", 8)), gs.Variable("y", np.float32, ("N", 8))
    t = gs.Variable("t", np.float32)
    nodes = [gs.Node("Transpose", "tr", {"perm": [1, 0]}, inputs=[x], outputs=[t]),
             gs.Node("Transpose", "back", {"perm": [1, 0]}, inputs=[t], outputs=[y])]
    return models._finish(gs.Graph(nodes, [x], [y], name="transposed"))


def test_peaks_are_kept_for_tensors_whose_axis_0_holds_the_samples(rng):
    x = rng.standard_normal((12, 8)).astype(np.float32)
    x[9] *= 10
    for batch in (1, 5, 8, None):  # batches of 8: t is (8, 8), yet its axis 0 is no batch
        stats = collect_stats(_transposed(), ArrayData({"x": x}, batch), ["x", "t", "y"],
                              session_options=_opts())
        top = np.argsort(-np.abs(x).max(axis=1), kind="stable")[:2]
        assert [p.sample for p in stats["x"].peaks] == [p.sample for p in stats["y"].peaks] == list(top)
        assert stats["t"].peaks == ()  # shape inference gives it (8, N): its samples cannot be told apart
    assert sample_axis_tensors(load_model(_transposed()), ["x", "t", "y"]) == {"x", "y"}


def test_unbatched_inputs_make_each_feed_one_sample(rng):
    model = load_model(models.conv_relu())
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_value = 1  # a fixed batch of 1
    x = rng.standard_normal((6, 1, 3, 8, 8)).astype(np.float32)
    x[4] *= 10
    stats = collect_stats(model, [{"x": sample} for sample in x], ["x", "y"], session_options=_opts())
    assert stats["x"].peaks[0].sample == 4 and len(stats["y"].peaks) == 2


def test_shards_count_samples_from_the_start_of_the_data(rng):
    x = (rng.standard_normal((23, 8)) * rng.uniform(0.1, 4, (23, 1))).astype(np.float32)
    names = ["x", "h", "r", "m"]
    serial = collect_stats(models.mlp(), ArrayData({"x": x}, 4), names, session_options=_opts())
    sharded = collect_stats(models.mlp(), ArrayData({"x": x}, 4), names,
                            CollectConfig(executor=LocalExecutor(), shards=3))
    assert dict(sharded) == dict(serial) and all(len(serial[n].peaks) == 2 for n in names)
    assert serial["x"].peaks[0].sample == int(np.abs(x).max(axis=1).argmax())
