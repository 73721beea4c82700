"""Data adapters and feed checks: batching, re-iteration, and error messages."""
from __future__ import annotations

import models
import numpy as np
import pytest

from quantdbg.data import ArrayData, FeedList, as_data, check_feed, load_npz
from quantdbg.errors import DataError
from quantdbg.model import input_specs, load_model


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
    with pytest.raises(DataError, match="without pickle"):
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
