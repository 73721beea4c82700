"""Every calibrator measured on one tensor's statistics: clips, histogram SQNR, the best, JSON."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

from quantdbg.calibration import CalibrationResult, CalibratorComparison, TensorStats, compare_calibrators
from quantdbg.calibration.calibrators.base import calibrator_amaxes, get_calibrator
from quantdbg.calibration.compare import histogram_sqnr
from quantdbg.calibration.stats import Collector
from quantdbg.config import CalibConfig
from quantdbg.errors import NotCalibratedError, QuantDbgWarning


def _hand_stats(counts: list[int], hist_range: float = 1.0) -> TensorStats:
    """|x| histogram over [0, hist_range) with the given counts (values spread evenly in each bin)."""
    hist = np.asarray(counts, np.int64)
    top = hist_range * (np.flatnonzero(hist)[-1] + 1) / hist.size if hist.any() else 0.0
    return TensorStats("t", -top, top, int(hist.sum()), 0, hist, hist_range)


def _collected(name: str, values: np.ndarray) -> TensorStats:
    collector = Collector([name], True, 2048)
    collector.update(name, values.astype(np.float32))
    return collector.result()[name]


# One bin of values in [0.75, 1): E[x^2] = (0.75^2 + 0.75 + 1) / 3.
MEAN_SQ = (0.75 ** 2 + 0.75 * 1.0 + 1.0) / 3


@pytest.mark.parametrize("amax, error", [
    (1.0, (1.0 / 127) ** 2 / 12),                  # inside the clip: uniform rounding error
    (0.5, (0.875 - 0.5) ** 2 + 0.25 ** 2 / 12),    # clipped: distance of the bin centre to the clip
    (300.0, MEAN_SQ),                              # half a step is above the bin: every value rounds to 0
])
def test_histogram_sqnr_by_hand(amax, error):
    stats = _hand_stats([0, 0, 0, 10])
    assert histogram_sqnr(stats, amax) == pytest.approx(10 * math.log10(MEAN_SQ / error), rel=1e-12)


def test_histogram_sqnr_of_an_all_zero_tensor_is_infinite_and_needs_a_histogram():
    assert histogram_sqnr(TensorStats("z", 0.0, 0.0, 4, 0, np.zeros(4, np.int64), 1.0), 1.0) == math.inf
    with pytest.raises(NotCalibratedError, match="Tensor 'm' has no histogram; collect it with histogram="):
        histogram_sqnr(TensorStats("m", -1.0, 1.0, 4), 1.0)


def _calibration(stats: dict[str, TensorStats], method: str = "minmax") -> CalibrationResult:
    ranges = {name: get_calibrator(method).compute(s) for name, s in stats.items()}
    return CalibrationResult(ranges, stats, CalibConfig(method=method), 1, 1)


def test_comparison_against_each_calibrator_and_numpy(rng):
    x = np.concatenate([rng.standard_normal(50_000), [40.0]]).astype(np.float32)
    stats = _collected("t", x)
    [item] = compare_calibrators(_calibration({"t": stats}))
    amax = calibrator_amaxes(stats)
    assert dict(item.amax) == amax and set(amax) >= {"minmax", "entropy", "percentile", "mse"}
    assert item.amax["minmax"] == pytest.approx(40.0)
    assert item.ratio == max(amax.values()) / min(amax.values())
    assert dict(item.tensor_sqnr) == {m: histogram_sqnr(stats, a) for m, a in amax.items()}
    assert item.best == max(item.tensor_sqnr, key=item.tensor_sqnr.get) != "minmax"
    assert item.layer_sqnr == {} and item.chosen == "minmax"
    assert item.gain_db == item.tensor_sqnr[item.best] - item.tensor_sqnr["minmax"]
    assert sum(item.hist) == stats.count and len(item.hist) <= 256
    assert (len(item.hist) - 1) * item.hist_width <= 40.0 < len(item.hist) * item.hist_width  # ends at max|x|


def test_layer_sqnr_decides_the_best_where_given(rng):
    stats = _collected("t", rng.standard_normal(10_000))
    layer = {"minmax": 31.0, "entropy": 30.0, "percentile": 29.0, "mse": math.nan}
    [item] = compare_calibrators(_calibration({"t": stats}), {"t": layer, "other": {"minmax": 1.0}})
    assert item.best == "minmax" and dict(item.layer_sqnr) == layer  # NaN never wins
    assert item.gain_db == 0.0


def test_tensors_without_a_histogram_or_values_are_left_out(rng):
    plain = TensorStats("p", -1.0, 1.0, 10)
    zeros = _collected("z", np.zeros(100))
    full = _collected("f", rng.standard_normal(1000))
    with pytest.warns(QuantDbgWarning, match="Tensor 'z' had only zeros"):
        calibration = _calibration({"p": plain, "z": zeros, "f": full})
    assert [c.tensor for c in compare_calibrators(calibration)] == ["f"]


def test_comparison_round_trips_with_infinite_sqnr():
    item = CalibratorComparison("t", "minmax", {"minmax": 2.0, "mse": 1.0}, {"minmax": math.inf, "mse": 20.0},
                                {}, "minmax", 2.0, (3, 1), 0.5)
    data = json.loads(json.dumps(item.to_dict(), allow_nan=False))
    assert data["tensor_sqnr"] == {"minmax": "inf", "mse": 20.0}
    assert list(data) == ["tensor", "chosen", "amax", "tensor_sqnr", "layer_sqnr", "best", "ratio", "hist",
                          "hist_width"]
    assert CalibratorComparison.from_dict(data) == item
