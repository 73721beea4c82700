"""Collectors and TensorStats: NumPy oracles, batching invariance, exact merging, JSON round trip."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

from quantdbg.calibration import stats as S
from quantdbg.errors import DataError, FormatError, NotCalibratedError


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


def test_tensor_stats_json_keeps_the_histogram_without_trailing_zeros():
    hist = np.zeros(2048, np.int64)
    hist[[0, 5, 9]] = [3, 1, 2]
    data = S.TensorStats("t", -1.5, 2.0, 6, 0, hist, 4.0).to_dict()
    assert data == {"name": "t", "min": -1.5, "max": 2.0, "count": 6, "nonfinite": 0,
                    "hist": [3, 0, 0, 0, 0, 1, 0, 0, 0, 2], "hist_bins": 2048, "hist_range": 4.0}
    empty = S.TensorStats("z", 0.0, 0.0, 0, 0, np.zeros(128, np.int64), 1.0).to_dict()
    assert (empty["hist"], empty["hist_bins"]) == ([], 128)
    assert S.TensorStats.from_dict(empty).hist.tolist() == [0] * 128


@pytest.mark.parametrize("change, message", [
    ({"hist_bins": 3}, "field 'hist_bins': expected a bin count >= 10 (the stored bins), got 3"),
    ({"hist_bins": None}, "field 'hist_bins': expected a bin count >= 10 (the stored bins), got null"),
    ({"hist": [1, "x"]}, "field 'hist': expected a rectangular array of int64"),
    ({"count": 1.5}, "field 'count': expected an integer, got 1.5"),
])
def test_tensor_stats_from_bad_json_names_the_field(change, message):
    hist = np.zeros(2048, np.int64)
    hist[9] = 1
    data = {**S.TensorStats("t", 0.0, 1.0, 1, 0, hist, 4.0).to_dict(), **change}
    with pytest.raises(FormatError) as err:
        S.TensorStats.from_dict(data, "stats.json")
    assert str(err.value).startswith(f"stats.json: not a valid TensorStats: {message}")


def test_merge_stats_equals_collecting_everything(rng):
    a = (rng.standard_normal(2000) * 0.3).astype(np.float32)
    b = (rng.standard_normal(500) * 50).astype(np.float32)
    merged = S.merge_stats("t", [_collect_all(a, [a.size]), _collect_all(b, [b.size])])
    assert merged == _collect_all(np.concatenate([a, b]), [a.size + b.size])


def test_integer_tensor_is_refused():
    collector = S.TensorCollector("ids")
    with pytest.raises(DataError, match="'ids' holds int64 values"):
        collector.update(np.arange(4))


# ---------------------------------------------------------------------------------------------
# Sample peaks: the two samples with the largest max |x|, exact under any batching and merge
# ---------------------------------------------------------------------------------------------

def _peaks_oracle(samples: np.ndarray) -> tuple[S.SamplePeak, ...]:
    """Largest finite |x| per sample (axis 0), the top two by value then index."""
    rows = np.abs(samples.reshape(samples.shape[0], -1).astype(np.float64))
    per = np.where(np.isfinite(rows), rows, -1).max(axis=1)
    ranked = sorted((i for i in range(per.size) if per[i] >= 0), key=lambda i: (-per[i], i))[:2]
    return tuple(S.SamplePeak(i, float(per[i])) for i in ranked)


def _collect_samples(samples: np.ndarray, sizes: list[int], first: int = 0) -> S.TensorStats:
    collector = S.TensorCollector("t")
    start = first
    for piece in np.split(samples, np.cumsum(sizes)[:-1]):
        collector.update(piece, start)
        start += piece.shape[0]
    return collector.result()


@pytest.mark.parametrize("sizes", [[40], [1] * 40, [7] * 5 + [5], [3, 30, 7]],
                         ids=["1x40", "40x1", "7s", "mixed"])
def test_peaks_are_the_two_largest_samples_whatever_the_batching(rng, sizes):
    samples = rng.standard_normal((40, 3, 5)).astype(np.float32)
    samples[11] = np.clip(samples[11] * 20, -60, 60)
    samples[29, 0, 0] = -80.0  # the largest |x| of all, negative
    samples[3, 1, 1] = np.nan  # left out; sample 3 still counts by its finite values
    peaks = _collect_samples(samples, sizes).peaks
    assert peaks == _peaks_oracle(samples) and peaks[0] == S.SamplePeak(29, 80.0) and peaks[1].sample == 11


def test_equal_peaks_go_to_the_earlier_sample_and_one_sample_counts_once():
    samples = np.ones((6, 4), np.float32)
    assert _collect_samples(samples, [2, 2, 2]).peaks == (S.SamplePeak(0, 1.0), S.SamplePeak(1, 1.0))
    # Statistics of two tensors over the same samples (a shared scale): sample 5 leads both.
    a = S.TensorStats("a", 0, 1, 8, peaks=(S.SamplePeak(5, 9.0), S.SamplePeak(2, 4.0)))
    b = S.TensorStats("b", 0, 1, 8, peaks=(S.SamplePeak(5, 7.0), S.SamplePeak(1, 3.0)))
    assert S.merge_stats("a+b", [a, b]).peaks == (S.SamplePeak(5, 9.0), S.SamplePeak(2, 4.0))


def test_shards_merge_into_the_peaks_of_one_pass(rng):
    samples = (rng.standard_normal((30, 8)) * rng.uniform(0.1, 5, (30, 1))).astype(np.float32)
    whole = _collect_samples(samples, [30])
    parts = [_collect_samples(samples[lo:hi], [hi - lo]) for lo, hi in ((0, 9), (9, 20), (20, 30))]
    merged = S.merge_stats("t", [S.shift_samples(p, lo) for p, lo in zip(parts, (0, 9, 20), strict=True)])
    assert merged == whole and len(whole.peaks) == 2


def test_a_batch_without_sample_axis_drops_the_peaks_for_good(rng):
    collector = S.TensorCollector("t")
    collector.update(rng.standard_normal((4, 3)).astype(np.float32), 0)
    collector.update(rng.standard_normal((4, 3)).astype(np.float32), None)
    collector.update(rng.standard_normal((4, 3)).astype(np.float32), 8)
    assert collector.result().peaks == ()
    tracked = S.TensorStats("t", -1.0, 1.0, 4, peaks=(S.SamplePeak(0, 1.0),))
    assert S.merge_stats("t", [tracked, collector.result()]).peaks == ()  # one member untracked


def test_peaks_travel_through_json():
    stats = S.TensorStats("t", -3.0, 2.5, 10, peaks=(S.SamplePeak(7, 3.0), S.SamplePeak(2, 2.5)))
    data = json.loads(json.dumps(stats.to_dict()))
    assert data["peaks"] == [{"sample": 7, "absmax": 3.0}, {"sample": 2, "absmax": 2.5}]
    assert S.TensorStats.from_dict(data) == stats


@pytest.mark.parametrize("sizes", [[40], [1] * 40, [7] * 5 + [5]], ids=["1x40", "40x1", "7s"])
def test_values_beyond_fp16_are_counted_apart_whatever_the_batching(rng, sizes):
    samples = (rng.standard_normal((40, 6)) * 3e4).astype(np.float32)
    samples[5, 2], samples[33, 0] = np.inf, -3e38
    stats = _collect_samples(samples, sizes)
    finite = np.abs(samples[np.isfinite(samples)])
    assert stats.beyond_fp16 == np.count_nonzero(finite > 65504) > 1
    assert stats.fp16_absmax == finite[finite <= 65504].max()
    assert S.TensorStats.from_dict(json.loads(json.dumps(stats.to_dict()))) == stats
    plain = _collect_samples(np.ones((4, 2), np.float32), [4])
    assert (plain.fp16_absmax, plain.beyond_fp16) == (1.0, 0)
    assert "beyond_fp16" not in plain.to_dict() and "fp16_absmax" not in S.TensorStats("t", 0, 0, 0).to_dict()
