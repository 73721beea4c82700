"""The |x| histogram kernels: numba and NumPy agree bit for bit, and both match np.histogram."""
from __future__ import annotations

import math

import numpy as np
import pytest

from quantdbg.calibration import _kernels as K

BINS = 1 << 12


def _tricky(rng: np.random.Generator, n: int = 20_000, huge: bool = False) -> np.ndarray:
    """Normal values plus NaN, +-Inf, -0.0, subnormals and values exactly on bin edges of the
    final range R = 512 (or, with ``huge``, values up to 3e38 so R = 2**128)."""
    x = np.clip(rng.standard_normal(n) * rng.choice([0.01, 1.0, 60.0], n), -500, 500).astype(np.float32)
    edges = (np.arange(0, BINS, 37) * (512.0 / BINS)).astype(np.float32)
    special = [np.nan, np.inf, -np.inf, -0.0, 0.0, 1e-45, -1e-40, 511.99997, -256.0, np.nan]
    if huge:
        special += [3.0e38, -2.0**20]
    out = np.concatenate([x, edges, -edges, np.array(special, np.float32)])
    return out[rng.permutation(out.size)]


def _reference(x: np.ndarray) -> tuple[np.ndarray, float]:
    """Independent oracle: np.histogram over [0, R), R the least power of two above max|x|."""
    finite = np.abs(x[np.isfinite(x)].astype(np.float64))
    top = float(finite.max())
    exponent = math.floor(math.log2(top)) + 1 if top > 0 else K.EXPONENT_UNSET
    limit = 2.0 ** exponent
    assert top < limit <= 2 * top or top == 0
    counts, _ = np.histogram(finite, bins=BINS, range=(0.0, limit))
    return counts, limit


@pytest.mark.parametrize("huge", [False, True])
@pytest.mark.parametrize("impl", ["numpy", "numba"])
def test_scan_matches_np_histogram_oracle(impl, huge, rng):
    if impl == "numba":
        pytest.importorskip("numba")
    scan = K.scan_numba if impl == "numba" else K.scan_numpy
    x = _tricky(rng, huge=huge)
    hist = np.zeros(BINS, np.int64)
    found = scan(x, hist, K.EXPONENT_UNSET)
    counts, limit = _reference(x)
    finite = x[np.isfinite(x)]
    assert math.ldexp(1.0, found.exponent) == limit
    np.testing.assert_array_equal(hist, counts)
    assert (found.lo, found.hi) == (finite.min(), finite.max())
    assert found.finite == finite.size and found.nonfinite == x.size - finite.size == 4
    assert limit == (2.0**128 if huge else 512.0)


@pytest.mark.parametrize("huge", [False, True])
def test_numba_and_numpy_agree_bit_for_bit_in_pieces(huge, rng):
    pytest.importorskip("numba")
    x = _tricky(rng, 50_000, huge=huge)
    results = []
    for scan in (K.scan_numba, K.scan_numpy):
        hist, exponent, nonfinite = np.zeros(BINS, np.int64), K.EXPONENT_UNSET, 0
        for piece in np.array_split(x, 13):  # growth happens mid-stream, at different points
            found = scan(piece, hist, exponent)
            exponent, nonfinite = found.exponent, nonfinite + found.nonfinite
        results.append((hist, exponent, nonfinite))
    (h1, e1, n1), (h2, e2, n2) = results
    np.testing.assert_array_equal(h1, h2)
    assert (e1, n1) == (e2, n2)


@pytest.mark.parametrize("impl", ["numpy", "numba"])
def test_histogram_independent_of_split_and_order(impl, rng):
    if impl == "numba":
        pytest.importorskip("numba")
    scan = K.scan_numba if impl == "numba" else K.scan_numpy
    x = _tricky(rng, 30_000)
    outcomes = set()
    for sizes in ([x.size], [1] * 50 + [x.size - 50], [7] * 100 + [x.size - 700]):
        order = rng.permutation(x.size)
        hist, exponent = np.zeros(BINS, np.int64), K.EXPONENT_UNSET
        for piece in np.split(x[order], np.cumsum(sizes)[:-1]):
            exponent = scan(piece, hist, exponent).exponent
        outcomes.add((exponent, hist.tobytes()))
    assert len(outcomes) == 1


def test_merge_bins_equals_binning_at_the_larger_range(rng):
    values = rng.uniform(0.0, 8.0, 10_000) ** 2 / 8.0  # skewed, all < 8
    small, _ = np.histogram(values, bins=BINS, range=(0.0, 8.0))
    for shift in (1, 3, 12, 20):
        grown = small.astype(np.int64).copy()
        K.merge_bins(grown, shift)
        expected, _ = np.histogram(values, bins=BINS, range=(0.0, 8.0 * 2**shift))
        np.testing.assert_array_equal(grown, expected)


def test_scan_minmax_counts_nonfinite_without_histogram():
    x = np.array([1.0, np.nan, -3.0, np.inf, 2.0], np.float32)
    found = K.scan_minmax(x)
    assert (found.lo, found.hi, found.finite, found.nonfinite) == (-3.0, 2.0, 3, 2)
    clean = K.scan_minmax(np.array([-0.5, 4.0], np.float32))
    assert (clean.lo, clean.hi, clean.nonfinite) == (-0.5, 4.0, 0)


def test_scan_falls_back_to_numpy_without_numba(monkeypatch, rng):
    x = _tricky(rng)
    gate = K._NumbaGate()
    monkeypatch.setattr(K, "_NUMBA", gate)
    monkeypatch.setattr(K, "_WARMUP_AFTER_BYTES", 0)  # past the threshold from the first call
    monkeypatch.setattr(K, "numba_available", lambda: False)
    monkeypatch.setattr(K, "scan_numba", lambda *a: pytest.fail("numba path used"))
    hist, exponent = np.zeros(BINS, np.int64), K.EXPONENT_UNSET
    exponent = K.scan(x, hist, exponent).exponent
    gate._loader.join(timeout=60)
    assert not gate._loader.is_alive(), "the numba loader did not finish within 60 s"
    K.scan(x, hist, exponent)
    assert gate.kernel is None
    np.testing.assert_array_equal(hist, 2 * _reference(x)[0])


def test_all_zero_input_stays_in_bin_zero():
    hist = np.zeros(BINS, np.int64)
    found = K.scan(np.zeros(100, np.float32), hist, K.EXPONENT_UNSET)
    assert found.exponent == K.EXPONENT_UNSET and hist[0] == 100 and hist.sum() == 100


@pytest.mark.parametrize("impl", ["numpy", "numba"])
def test_scan_of_subnormal_values_matches_oracle(impl, rng):
    # The range exponent is about -130 here, so the bin scale 2**(12+130) is outside float32.
    if impl == "numba":
        pytest.importorskip("numba")
    scan = K.scan_numba if impl == "numba" else K.scan_numpy
    x = (rng.standard_normal(5_000) * 1e-39).astype(np.float32)
    hist = np.zeros(BINS, np.int64)
    found = scan(x, hist, K.EXPONENT_UNSET)
    counts, limit = _reference(x)
    assert math.ldexp(1.0, found.exponent) == limit < 2.0**-120
    np.testing.assert_array_equal(hist, counts)


def test_scan_loads_numba_only_after_enough_data(monkeypatch, rng):
    pytest.importorskip("numba")
    gate = K._NumbaGate()
    monkeypatch.setattr(K, "_NUMBA", gate)
    monkeypatch.setattr(K, "_WARMUP_AFTER_BYTES", 3 * 4 * 1000)
    used = []
    real_numba = K.scan_numba
    monkeypatch.setattr(K, "scan_numba", lambda *a: used.append("numba") or real_numba(*a))
    x = _tricky(rng, 1000)
    hist, exponent = np.zeros(BINS, np.int64), K.EXPONENT_UNSET
    for _ in range(2):  # 2 x 4 KB: below the threshold, NumPy only, nothing loading
        exponent = K.scan(x, hist, exponent).exponent
    assert used == [] and gate._loader is None
    exponent = K.scan(x, hist, exponent).exponent  # crosses it: the loader starts, NumPy still scans
    assert used == [] and gate._loader is not None
    gate._loader.join(timeout=120)
    assert not gate._loader.is_alive(), "the numba loader did not finish within 120 s"
    exponent = K.scan(x, hist, exponent).exponent
    assert used == ["numba"]
    np.testing.assert_array_equal(hist, _reference(np.concatenate([x] * 4))[0])
