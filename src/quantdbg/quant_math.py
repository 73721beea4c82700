"""The arithmetic of symmetric INT8 quantization, each fact once.

TensorRT's explicit quantization is symmetric: a tensor (or a weight's output channel) with clip
``amax`` gets ``scale = amax / 127`` and zero point 0; weights take the values -127..127, so
they never land on -128. Everything that needs one of these facts (placement, insertion, lint,
evidence, doctor checks, caches) asks this module.
"""
from __future__ import annotations

import math

import numpy as np

QMAX = 127
"""Largest INT8 magnitude of a symmetric pair: scale = amax / QMAX."""

TINY_AMAX = float(np.finfo(np.float32).tiny) * QMAX
"""Below this a range cannot give a normal float32 scale; such ranges get scale 1/QMAX instead."""

FP16_MAX = float(np.finfo(np.float16).max)
"""The largest float16 magnitude (65504): a value beyond it has no FP16 form, so neither an FP16
fallback nor a mixed-precision engine can hold it."""

ZEROING_FACTOR = 2 * QMAX
"""A range more than this many times a value rounds that value to 0 in INT8:
``|x| / (amax / 127) < 0.5`` when ``amax > 254 |x|``."""

NSR_CAP = 1e6
"""Noise-to-signal ratio reported for a broken signal (non-finite values, zero signal)."""


def scale_from_amax(amax: np.ndarray | float) -> np.ndarray:
    """float32 ``amax / 127``; an all-zero, subnormal or non-finite range gets 1/127 instead.

    Any non-zero scale reproduces zeros exactly, and ONNX requires a positive scale.
    """
    amax = np.asarray(amax, np.float64)
    safe = np.where(np.isfinite(amax) & (amax >= TINY_AMAX), amax, 1.0)
    return (safe / QMAX).astype(np.float32)


def weight_axis(op_type: str, rank: int, trans_b: bool = False) -> int | None:
    """The output-channel axis of input 1 (the weight) of a weighted op, or None when it has none.

    Conv ``[C_out, C_in/group, k...]``: 0. ConvTranspose ``[C_in, C_out/group, k...]``: 1.
    Gemm: 0 when ``transB`` (B is ``[N, K]``), else 1. MatMul ``[..., K, N]``: the last axis.
    Weights of rank below 2 and other op types have no channel axis (quantized per tensor).
    """
    if rank < 2:
        return None
    if op_type == "Conv":
        return 0
    if op_type == "ConvTranspose":
        return 1
    if op_type == "Gemm":
        return (0 if trans_b else 1) if rank == 2 else None
    if op_type == "MatMul":
        return rank - 1
    return None


def channel_axis(op_type: str, rank: int, trans_b: bool = False, recorded: int | None = None) -> int:
    """The axis per-channel weight statistics are taken along: a pair's own ``recorded`` axis when it
    is per channel, else the op's output-channel axis (:func:`weight_axis`), else 0."""
    if recorded is not None:
        return recorded % rank if rank else 0
    axis = weight_axis(op_type, rank, trans_b)
    return 0 if axis is None else axis


def channel_amax(weight: np.ndarray, axis: int | None) -> np.ndarray:
    """max |w| per slice along ``axis`` (shape: the weight's rank, 1 off-axis), or overall when None."""
    w = np.abs(np.asarray(weight))
    if axis is None or w.ndim == 0:
        return np.asarray(w.max() if w.size else 0.0)
    return w.max(axis=tuple(a for a in range(w.ndim) if a != axis), keepdims=True)


def channel_scale(weight: np.ndarray, axis: int | None) -> np.ndarray:
    """float64 ``amax / 127`` per output channel (broadcastable to ``weight``); zero channels get 1/127."""
    amax = channel_amax(np.asarray(weight, np.float64), axis)
    return np.where(amax > 0, amax, 1.0) / QMAX


def fake_quant(x: np.ndarray, scale: np.ndarray | float, lo: int = -QMAX, hi: int = QMAX) -> np.ndarray:
    """Quantize-dequantize: ``clip(round(x / scale), lo, hi) * scale`` (round half to even, as Q does)."""
    return np.clip(np.round(x / scale), lo, hi) * scale


def zeroed_fraction(weight: np.ndarray, scale: np.ndarray | float) -> float:
    """Share of the non-zero entries of ``weight`` with ``round(w / scale) == 0``.

    ``np.round`` rounds half to even, as QuantizeLinear does, so ``|w| == scale / 2`` counts as 0.
    """
    w = np.asarray(weight, np.float64)
    nonzero = w != 0
    count = int(nonzero.sum())
    if count == 0:
        return 0.0
    return float((nonzero & (np.round(w / scale) == 0)).sum()) / count


def fp16_split(values: np.ndarray, axis: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """How the finite values fall about float16's range, per slice along ``axis`` (as
    :func:`channel_amax`) or overall: the max |x| of those float16 can hold (-1 where there is none)
    and how many lie beyond it."""
    mags = np.abs(np.asarray(values, np.float64))
    within = mags <= FP16_MAX  # NaN compares False
    beyond = ~within & np.isfinite(mags)
    ordinary = np.where(within, mags, -1.0)
    if axis is None or mags.ndim == 0:
        return np.asarray(ordinary.max(initial=-1.0)), np.asarray(np.count_nonzero(beyond))
    axes = tuple(a for a in range(mags.ndim) if a != axis)
    return ordinary.max(axis=axes, keepdims=True, initial=-1.0), beyond.sum(axis=axes, keepdims=True)


def outliers_zero_the_rest(amax: np.ndarray | float, ordinary: np.ndarray | float,
                           beyond: np.ndarray | int, within: np.ndarray | int) -> np.ndarray:
    """Where a range ``amax`` set by values beyond float16's range rounds every value float16 can
    hold to 0 (it exceeds :data:`ZEROING_FACTOR` times their max, ``ordinary``) while those values
    outnumber the ones beyond (``beyond`` against ``within``): most of the tensor is lost. That is
    the mark of corrupt values (a ``3e38``), not of a tensor that is merely large, which INT8 holds
    well since it does not care about scale."""
    amax, ordinary = np.asarray(amax, np.float64), np.asarray(ordinary, np.float64)
    return (amax > FP16_MAX) & (np.asarray(within) > np.asarray(beyond)) & (amax > ZEROING_FACTOR * ordinary)


def sqnr_db(signal: float, noise: float) -> float:
    """SQNR in dB from ``sum r^2`` and ``sum (t - r)^2``: +inf without noise, -inf without signal."""
    if noise == 0.0:
        return math.inf
    if signal == 0.0:
        return -math.inf
    return 10.0 * math.log10(signal / noise)


def nsr(sqnr: float) -> float:
    """Noise-to-signal power ratio ``10^(-SQNR/10)``: 0 for +inf dB, inf for -inf dB."""
    if math.isfinite(sqnr):
        return 10.0 ** (-sqnr / 10.0)
    return 0.0 if sqnr > 0 else math.inf
