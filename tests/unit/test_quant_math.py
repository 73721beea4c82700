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


def test_channel_scale_and_fake_quant_match_a_hand_computation():
    w = np.array([[1.0, -0.5], [0.0, 0.25], [-2.54, 0.0]])  # [K=3, N=2]: channels are columns
    scale = qm.channel_scale(w, 1)
    assert scale.shape == (1, 2)
    np.testing.assert_allclose(scale, [[2.54 / 127, 0.5 / 127]])
    q = qm.fake_quant(w, scale)
    np.testing.assert_allclose(q[:, 0], np.round(w[:, 0] / (2.54 / 127)) * (2.54 / 127))
    assert qm.channel_scale(np.zeros((2, 2)), 0).tolist() == [[1 / 127], [1 / 127]]


def test_fake_quant_saturates():
    assert qm.fake_quant(np.array([10.0, -10.0]), 0.01).tolist() == [1.27, -1.27]
    assert qm.fake_quant(np.array([-10.0]), 0.01, lo=-128).tolist() == [-1.28]


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
