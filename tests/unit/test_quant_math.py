"""quant_math: each quantization fact against a hand computation."""
from __future__ import annotations

import math

import numpy as np
import pytest

from quantdbg import quant_math as qm


@pytest.mark.parametrize(("op", "rank", "trans_b", "axis"), [
    ("Conv", 4, False, 0), ("Conv", 3, False, 0), ("ConvTranspose", 4, False, 1),
    ("Gemm", 2, False, 1), ("Gemm", 2, True, 0), ("Gemm", 3, False, None),
    ("MatMul", 2, False, 1), ("MatMul", 3, False, 2), ("MatMul", 1, False, None),
    ("ConvTranspose", 1, False, None), ("Add", 2, False, None),
])
def test_weight_axis(op, rank, trans_b, axis):
    assert qm.weight_axis(op, rank, trans_b) == axis


def test_channel_axis_prefers_the_recorded_axis_and_falls_back_to_zero():
    assert qm.channel_axis("MatMul", 2, recorded=-1) == 1
    assert qm.channel_axis("MatMul", 2) == 1
    assert qm.channel_axis("Mul", 2) == 0
    assert qm.channel_axis("ConvTranspose", 1) == 0


def test_scale_from_amax_is_float32_and_positive():
    got = qm.scale_from_amax(np.array([254.0, 0.0, np.inf, 1e-40]))
    assert got.dtype == np.float32
    assert got.tolist() == [np.float32(2.0), np.float32(1 / 127), np.float32(1 / 127), np.float32(1 / 127)]


def _nearest_on_grid(x: np.ndarray, scale: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """Brute force: each value's nearest point of the grid ``{k * scale : lo <= k <= hi}``, found by
    measuring the distance to every point (a tie goes to the even k, as QuantizeLinear rounds)."""
    ks = np.arange(lo, hi + 1, dtype=np.float64)
    x, scale = np.broadcast_arrays(np.asarray(x, np.float64), np.asarray(scale, np.float64))
    distance = np.abs(x[..., None] - ks * scale[..., None])
    best = distance.min(axis=-1, keepdims=True)
    tied = np.isclose(distance, best, rtol=0, atol=1e-12 * np.abs(scale[..., None]).max())
    pick = np.where(tied & (ks % 2 == 0), 0, np.where(tied, 1, 2)).argmin(axis=-1)
    return ks[pick] * scale


def test_channel_scale_maps_each_channels_largest_magnitude_to_127():
    w = np.array([[1.0, -0.5], [0.0, 0.25], [-2.54, 0.0]])  # [K=3, N=2]: channels are columns
    scale = qm.channel_scale(w, 1)
    assert scale.shape == (1, 2)
    # Hand computation: column 0 peaks at |-2.54|, column 1 at |-0.5|; 2.54 / 127 = 0.02 exactly in
    # decimal, 0.5 / 127 = 0.003937007874...
    np.testing.assert_allclose(scale, [[0.02, 0.003937007874015748]], rtol=1e-15)
    # The largest magnitude lands on code 127 and nothing is clipped; any smaller scale clips it.
    assert np.abs(w / scale).max(axis=0).tolist() == pytest.approx([127.0, 127.0], rel=1e-12)
    assert (np.abs(w / (scale * (1 - 1e-9))).max(axis=0) > 127).all()
    assert qm.channel_scale(np.zeros((2, 2)), 0).tolist() == [[1 / 127], [1 / 127]]


def test_fake_quant_is_the_nearest_grid_point_by_brute_force(rng):
    w = rng.standard_normal((16, 5)) * np.array([1.0, 0.1, 3.0, 1e-3, 40.0])
    scale = qm.channel_scale(w, 1)
    want = _nearest_on_grid(w, scale, -127, 127)
    np.testing.assert_allclose(qm.fake_quant(w, scale), want, rtol=0, atol=1e-12)
    x = rng.uniform(-3, 3, 200)  # beyond the grid: saturates at the ends
    want = _nearest_on_grid(x, np.array(0.01), -128, 127)
    np.testing.assert_allclose(qm.fake_quant(x, 0.01, lo=-128), want, rtol=0, atol=1e-12)


def test_fake_quant_hand_values_round_half_to_even():
    # With scale 0.5 the codes are x / 0.5: 0.5 -> 0 (even), 1.5 -> 2, 2.5 -> 2, -1.5 -> -2, 0.6 -> 1;
    # times 0.5 that is 0, 1, 1, -1, 0.5. Every one of these numbers is exact in binary floating point.
    got = qm.fake_quant(np.array([0.25, 0.75, 1.25, -0.75, 0.3]), 0.5)
    assert got.tolist() == [0.0, 1.0, 1.0, -1.0, 0.5]


def test_zeroed_fraction_rounds_half_to_even():
    w = np.array([0.5, 1.5, 0.49, 0.0, 2.0])  # with scale 1: 0.5 -> 0, 1.5 -> 2, 0.49 -> 0
    assert qm.zeroed_fraction(w, 1.0) == pytest.approx(2 / 4)
    assert qm.zeroed_fraction(np.zeros(3), 1.0) == 0.0


def test_sqnr_and_nsr_edge_cases():
    assert qm.sqnr_db(100.0, 1.0) == pytest.approx(20.0)
    assert qm.sqnr_db(0.0, 0.0) == math.inf and qm.sqnr_db(1.0, 0.0) == math.inf
    assert qm.sqnr_db(0.0, 1.0) == -math.inf
    assert qm.nsr(20.0) == pytest.approx(0.01)
    assert qm.nsr(math.inf) == 0.0 and qm.nsr(-math.inf) == math.inf
