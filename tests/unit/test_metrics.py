"""Output metrics against independent NumPy formulas, the zero-signal table, and JSON round trips."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

from quantdbg.errors import ConfigError, DataError
from quantdbg.evaluation import Comparison, OutputMetrics, compare_arrays, compare_outputs
from quantdbg.evaluation.metrics import MetricAccumulator, metrics_from_sums


def _oracle(ref: np.ndarray, test: np.ndarray) -> dict[str, float]:
    r = ref.astype(np.float64).ravel()
    t = test.astype(np.float64).ravel()
    rows_r = ref.astype(np.float64).reshape(len(ref), -1)
    rows_t = test.astype(np.float64).reshape(len(test), -1)
    per_row = [a @ b / (np.linalg.norm(a) * np.linalg.norm(b)) for a, b in zip(rows_r, rows_t, strict=True)]
    return {"sqnr": 10 * np.log10(np.sum(r**2) / np.sum((r - t) ** 2)),
            "cosine": r @ t / (np.linalg.norm(r) * np.linalg.norm(t)),
            "sample_cosine": float(np.mean(per_row)), "min_sample_cosine": float(np.min(per_row)),
            "rel_l2": np.linalg.norm(r - t) / np.linalg.norm(r), "max_abs": np.max(np.abs(r - t))}


def test_metrics_match_numpy_formulas(rng):
    ref = rng.standard_normal((6, 3, 5)).astype(np.float32)
    test = (ref + 0.05 * rng.standard_normal(ref.shape)).astype(np.float32)
    got = compare_arrays(ref, test)
    want = _oracle(ref, test)
    assert got.sqnr_db == pytest.approx(want["sqnr"], rel=1e-12)
    assert got.cosine == pytest.approx(want["cosine"], rel=1e-12)
    assert got.sample_cosine == pytest.approx(want["sample_cosine"], rel=1e-12)
    assert got.min_sample_cosine == pytest.approx(want["min_sample_cosine"], rel=1e-12)
    assert got.rel_l2 == pytest.approx(want["rel_l2"], rel=1e-12)
    assert got.max_abs == pytest.approx(want["max_abs"], rel=1e-12)
    assert got.count == ref.size


def test_batching_does_not_change_the_result(rng):
    ref = rng.standard_normal((10, 4)).astype(np.float32)
    test = (ref * 1.1 + 0.01).astype(np.float32)
    whole = compare_arrays(ref, test)
    acc = MetricAccumulator()
    for start, stop in ((0, 3), (3, 4), (4, 10)):
        acc.update({"y": ref[start:stop]}, {"y": test[start:stop]})
    batched = acc.result().total
    for field in ("sqnr_db", "cosine", "sample_cosine", "min_sample_cosine", "rel_l2", "max_abs"):
        assert getattr(batched, field) == pytest.approx(getattr(whole, field), rel=1e-12)


@pytest.mark.parametrize(("ref", "test", "want"), [
    (np.zeros((2, 3)), np.zeros((2, 3)), (math.inf, 1.0, 0.0, 0.0)),
    (np.zeros((2, 3)), np.ones((2, 3)), (-math.inf, 0.0, math.inf, 1.0)),
    (np.full((2, 3), 2.0), np.zeros((2, 3)), (0.0, 0.0, 1.0, 2.0)),
    (np.full((2, 3), 2.0), np.full((2, 3), 2.0), (math.inf, 1.0, 0.0, 0.0)),
])
def test_zero_signals_have_defined_results(ref, test, want):
    got = compare_arrays(ref, test)
    assert (got.sqnr_db, got.cosine, got.rel_l2, got.max_abs) == want
    assert not any(math.isnan(v) for v in (got.sample_cosine, got.min_sample_cosine))


def test_nonfinite_test_values_are_counted_and_worst():
    ref = np.ones((2, 2), np.float32)
    test = np.array([[1.0, np.nan], [1.0, 1.0]], np.float32)
    got = compare_arrays(ref, test)
    assert got.nonfinite == 1
    assert (got.sqnr_db, got.cosine, got.rel_l2, got.max_abs) == (-math.inf, 0.0, math.inf, math.inf)
    assert got.min_sample_cosine == 0.0 and got.sample_cosine == pytest.approx(0.5)


def test_per_output_and_pooled(rng):
    a_ref, b_ref = rng.standard_normal((4, 3)), rng.standard_normal((4, 2)) * 10
    a_t, b_t = a_ref + 0.1, b_ref - 0.2
    result = compare_outputs([{"a": a_ref, "b": b_ref}], [{"a": a_t, "b": b_t}])
    assert result.outputs["a"].sqnr_db == pytest.approx(_oracle(a_ref, a_t)["sqnr"])
    assert result.outputs["b"].sqnr_db == pytest.approx(_oracle(b_ref, b_t)["sqnr"])
    pooled_ref = np.concatenate([a_ref, b_ref], axis=1)
    pooled_t = np.concatenate([a_t, b_t], axis=1)
    want = _oracle(pooled_ref, pooled_t)
    assert result.total.sqnr_db == pytest.approx(want["sqnr"])
    assert result.total.sample_cosine == pytest.approx(want["sample_cosine"])
    assert result.total.max_abs == pytest.approx(want["max_abs"])


def test_metrics_from_sums_agree_with_arrays(rng):
    ref = rng.standard_normal((5, 7))
    test = ref + 0.3 * rng.standard_normal((5, 7))
    full = compare_arrays(ref, test)
    sums = metrics_from_sums(float((ref**2).sum()), float(((test - ref) ** 2).sum()),
                             float((ref * test).sum()), float((test**2).sum()),
                             float(np.abs(test - ref).max()), ref.size)
    assert sums.sqnr_db == pytest.approx(full.sqnr_db)
    assert sums.cosine == pytest.approx(full.cosine)
    assert sums.rel_l2 == pytest.approx(full.rel_l2)
    assert sums.sample_cosine is None and sums.min_sample_cosine is None


def test_json_round_trip_keeps_infinities():
    result = compare_outputs([{"y": np.zeros((2, 2))}, {"y": np.ones((1, 2))}],
                             [{"y": np.zeros((2, 2))}, {"y": np.ones((1, 2))}])
    text = json.dumps(result.to_dict(), allow_nan=False)  # strict JSON: no bare Infinity
    assert Comparison.from_dict(json.loads(text)) == result
    assert OutputMetrics.from_dict(result.total.to_dict()) == result.total
    assert result.total.sqnr_db == math.inf


def test_shape_mismatch_names_the_output():
    acc = MetricAccumulator()
    with pytest.raises(DataError, match=r"^Output 'y': reference shape \(2, 3\) differs from compared shape "
                                        r"\(3, 2\); compare outputs of the same batch\.$"):
        acc.update({"y": np.zeros((2, 3))}, {"y": np.zeros((3, 2))})
    with pytest.raises(DataError, match=r"^Output 'y' is missing from the outputs being compared"):
        acc.update({"y": np.zeros(2)}, {"z": np.zeros(2)})


def test_unknown_metric_name():
    with pytest.raises(ConfigError, match=r"^Unknown output metric 'snr'; choose one of sqnr, cosine"):
        compare_arrays(np.ones(2), np.ones(2)).value("snr")  # type: ignore[arg-type]


def test_empty_accumulator_is_an_error():
    with pytest.raises(DataError, match="yielded no batches"):
        MetricAccumulator().result()
