"""Data adapters and feed checks: batching, re-iteration, and error messages."""
from __future__ import annotations

import logging

import models
import models_weights
import numpy as np
import pytest

from quantdbg.data import (
    ArrayData,
    FeedList,
    SampleFeed,
    as_data,
    as_model_data,
    check_feed,
    fit_to_inputs,
    load_npz,
    samples_in,
)
from quantdbg.errors import DataError, QuantDbgWarning
from quantdbg.model import load_model
from quantdbg.model.specs import input_specs


@pytest.fixture
def specs():
    return input_specs(load_model(models.conv_relu()))


def test_array_data_batches_cover_every_sample_once_in_order(rng):
    x = rng.standard_normal((10, 3, 8, 8)).astype(np.float32)
    batches = list(ArrayData({"x": x}, batch_size=4))
    assert [b["x"].shape[0] for b in batches] == [4, 4, 2]
    np.testing.assert_array_equal(np.concatenate([b["x"] for b in batches]), x)
    assert ArrayData({"x": x}, batch_size=4).num_batches == 3


def test_generator_is_materialised_so_every_pass_sees_the_same_batches(rng):
    feeds = ({"x": rng.standard_normal((1, 3, 8, 8)).astype(np.float32)} for _ in range(3))
    data = as_data(feeds)
    first, second = [f["x"] for f in data], [f["x"] for f in data]
    assert len(first) == 3
    for a, b in zip(first, second, strict=True):
        np.testing.assert_array_equal(a, b)
    assert len({id(f) for f in data}) == 3  # one dict per feed, never [{}] * n


def test_npz_round_trip_without_pickle(tmp_path, rng):
    x = rng.standard_normal((5, 3, 8, 8)).astype(np.float32)
    np.savez(tmp_path / "c.npz", x=x, label=np.arange(5))
    data = load_npz(tmp_path / "c.npz", batch_size=2, inputs=["x"])
    assert list(data.arrays) == ["x"] and len(data) == 5
    with pytest.raises(DataError, match=r"has no array named 'y' \(it holds \['label', 'x'\]\)"):
        load_npz(tmp_path / "c.npz", inputs=["y"])


def test_npz_with_pickled_objects_is_refused(tmp_path):
    np.savez(tmp_path / "p.npz", x=np.array([{"a": 1}], dtype=object))
    with pytest.raises(DataError, match="holds Python objects"):
        load_npz(tmp_path / "p.npz")


@pytest.mark.parametrize("feed, message", [
    ({}, r"calibration batch 3 lacks model input 'x'"),
    ({"x": np.zeros((1, 3, 8, 8), np.float32), "z": np.zeros(1)}, r"has 'z', which is not a model input"),
    ({"x": np.zeros((1, 3, 8, 8), np.float64)}, r"input 'x' expects dtype float32, got float64"),
    ({"x": np.zeros((3, 8, 8), np.float32)},
     r"input 'x' expects rank 4 \(N, 3, 8, 8\), got shape \(3, 8, 8\)"),
    ({"x": np.zeros((2, 4, 8, 8), np.float32)}, r"input 'x' expects 3 on axis 1"),
])
def test_check_feed_names_input_expected_and_found(specs, feed, message):
    with pytest.raises(DataError, match=message):
        check_feed(feed, specs, where="calibration batch 3")


def test_dynamic_batch_dim_accepts_any_size(specs):
    out = check_feed({"x": np.zeros((7, 3, 8, 8), np.float32)}, specs)
    assert out["x"].shape == (7, 3, 8, 8) and out["x"].flags.c_contiguous


def test_empty_data_is_refused():
    with pytest.raises(DataError, match="no feeds"):
        FeedList([])
    with pytest.raises(DataError, match="hold no samples"):
        ArrayData({"x": np.zeros((0, 3), np.float32)})
    with pytest.raises(DataError, match="disagree on the number of samples"):
        ArrayData({"a": np.zeros((2, 3)), "b": np.zeros((3, 3))})


# ---------------------------------------------------------------------------------------------
# Fitting data to the model's batch axis
# ---------------------------------------------------------------------------------------------

def _specs(model) -> dict:
    return input_specs(load_model(model))


def test_feed_layout_reads_fixed_and_missing_batch_axes():
    from quantdbg.data import FeedLayout, feed_layout

    fixed, free = _specs(models_weights.small_cnn(batch=1)), _specs(models_weights.small_cnn())
    sequence = _specs(models_weights.sequence_model())
    assert feed_layout({"x": (32, 3, 8, 8)}, fixed) == FeedLayout(batch=1)
    assert feed_layout({"x": (32, 3, 8, 8)}, free) == FeedLayout()
    assert feed_layout({"x": (16, 7, 6)}, sequence) == FeedLayout(unbatched=True)
    assert feed_layout({"x": (7, 6)}, sequence) == FeedLayout()
    assert feed_layout({"x": (32, 8, 8)}, fixed) == FeedLayout()  # a wrong rank: check_feed names it


def test_a_state_input_fixed_at_one_does_not_make_a_sequence_axis_a_batch(rng):
    from quantdbg.data import FeedLayout, as_model_data, feed_layout

    model = models_weights.stateful_sequence_model()
    specs = _specs(model)
    # One sequence of 7 frames with its state: axis 0 of x is time, not a batch of 7.
    assert feed_layout({"x": (7, 6), "state": (1, 1, 6)}, specs) == FeedLayout()
    assert feed_layout({"x": (4, 7, 6), "state": (4, 1, 1, 6)}, specs) == FeedLayout(unbatched=True)
    x = rng.standard_normal((7, 6)).astype(np.float32)
    state = rng.standard_normal((1, 1, 6)).astype(np.float32)
    feeds = list(as_model_data([{"x": x, "state": state}], load_model(model)))
    assert len(feeds) == 1
    np.testing.assert_array_equal(feeds[0]["x"], x)


def test_a_fixed_batch_of_one_is_fed_one_sample_at_a_time_with_one_log_line(rng, caplog):
    x = rng.standard_normal((5, 3, 8, 8)).astype(np.float32)
    model = load_model(models_weights.small_cnn(batch=1))
    with caplog.at_level(logging.INFO, logger="quantdbg.data"):
        data = as_model_data({"x": x}, model, batch_size=32)
    assert [r.getMessage() for r in caplog.records] == [
        "Input 'x' has a fixed batch dimension of 1: feeding 1 sample(s) per batch (batch size 32 asked)."]
    feeds = list(data)
    assert [f["x"].shape for f in feeds] == [(1, 3, 8, 8)] * 5
    np.testing.assert_array_equal(np.concatenate([f["x"] for f in feeds]), x)
    assert data.num_batches == 5 and sum(samples_in(f) for f in feeds) == 5
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="quantdbg.data"):
        assert fit_to_inputs(data, input_specs(model)) is data  # fitted once: no second log line
    assert caplog.records == []


def test_a_fixed_batch_above_one_drops_the_last_partial_batch_with_a_warning(rng):
    x = rng.standard_normal((11, 3, 8, 8)).astype(np.float32)
    model = load_model(models_weights.small_cnn(batch=3))
    with pytest.warns(QuantDbgWarning, match=r"fixed batch dimension of 3: the last 2 of 11 samples do not "
                                             "fill a batch and are left out"):
        data = as_model_data({"x": x}, model)
    feeds = list(data)
    assert [f["x"].shape[0] for f in feeds] == [3, 3, 3]
    np.testing.assert_array_equal(np.concatenate([f["x"] for f in feeds]), x[:9])
    with pytest.raises(DataError, match=r"Input 'x' has a fixed batch dimension of 3, but the data holds "
                                        r"only 2 sample\(s\); give at least 3"):
        as_model_data({"x": x[:2]}, model)


def test_ready_feeds_are_cut_to_the_fixed_batch(rng):
    feeds = [{"x": rng.standard_normal((4, 3, 8, 8)).astype(np.float32)} for _ in range(2)]
    data = as_model_data(feeds, load_model(models_weights.small_cnn(batch=1)))
    assert isinstance(data, FeedList) and len(data) == 8
    np.testing.assert_array_equal(np.concatenate([f["x"] for f in data]),
                                  np.concatenate([f["x"] for f in feeds]))


def test_data_with_a_sample_axis_more_than_an_unbatched_input_is_fed_one_sample_at_a_time(rng, caplog):
    x = rng.standard_normal((4, 7, 6)).astype(np.float32)
    model = load_model(models_weights.sequence_model())
    with caplog.at_level(logging.INFO, logger="quantdbg.data"):
        data = as_model_data({"x": x}, model, batch_size=32)
    assert len(caplog.records) == 1 and "no batch axis" in caplog.records[0].getMessage()
    feeds = list(data)
    assert all(isinstance(f, SampleFeed) and f["x"].shape == (7, 6) for f in feeds)
    np.testing.assert_array_equal(np.stack([f["x"] for f in feeds]), x)
    checked = check_feed(feeds[0], input_specs(model))
    assert isinstance(checked, SampleFeed) and samples_in(checked) == 1
    assert data.with_batch_size(2).num_batches == 4 and len(data.subset(np.array([0, 2]))) == 2
    listed = as_model_data([{"x": x[:2]}, {"x": x[2:]}], model)
    assert [f["x"].shape for f in listed] == [(7, 6)] * 4 and all(isinstance(f, SampleFeed) for f in listed)


def _scales(path) -> dict:
    import json

    return json.loads(path.read_text())


@pytest.mark.parametrize("method", ["minmax", "entropy"])
def test_a_batch_one_model_calibrates_from_a_32_sample_npz_like_one_sample_at_a_time(tmp_path, rng, method):
    import onnx

    import quantdbg
    from quantdbg.cli import main

    x = rng.standard_normal((32, 3, 8, 8)).astype(np.float32)
    model = models_weights.small_cnn(batch=1)
    np.savez(tmp_path / "calib.npz", x=x)
    config = quantdbg.CalibConfig(method=method)
    by_hand = quantdbg.quantize(model, [{"x": x[i:i + 1]} for i in range(32)], config)
    api = quantdbg.quantize(model, tmp_path / "calib.npz", config, batch_size=32)
    assert api.calibration.scales() == by_hand.calibration.scales()
    assert (api.calibration.n_batches, api.calibration.n_samples) == (32, 32)
    onnx.save(model, str(tmp_path / "model.onnx"))
    status = main(["calibrate", str(tmp_path / "model.onnx"), "--data", str(tmp_path / "calib.npz"),
                   "--method", method, "--batch-size", "32", "--out", str(tmp_path / "q.onnx"), "--scales",
                   str(tmp_path / "s.json"), "--no-progress"])
    assert status == 0
    written = _scales(tmp_path / "s.json")
    quantdbg.qdq.write_scales_json(by_hand, tmp_path / "by_hand.json")
    assert written == _scales(tmp_path / "by_hand.json")


def test_a_sequence_model_without_a_batch_axis_calibrates_from_rank_3_data(tmp_path, rng):
    import onnx

    import quantdbg
    from quantdbg.cli import main

    x = rng.standard_normal((16, 7, 6)).astype(np.float32)
    model = models_weights.sequence_model()
    config = quantdbg.CalibConfig(method="minmax")
    by_hand = quantdbg.quantize(model, [{"x": x[i]} for i in range(16)], config)
    api = quantdbg.quantize(model, {"x": x}, config)
    assert api.calibration.scales() == by_hand.calibration.scales()
    assert (api.calibration.n_batches, api.calibration.n_samples) == (16, 16)
    np.savez(tmp_path / "calib.npz", x=x)
    onnx.save(model, str(tmp_path / "model.onnx"))
    status = main(["calibrate", str(tmp_path / "model.onnx"), "--data", str(tmp_path / "calib.npz"),
                   "--method", "minmax", "--out", str(tmp_path / "q.onnx"), "--scales",
                   str(tmp_path / "s.json"), "--no-progress"])
    assert status == 0
    quantdbg.qdq.write_scales_json(by_hand, tmp_path / "by_hand.json")
    assert _scales(tmp_path / "s.json") == _scales(tmp_path / "by_hand.json")
