"""The calibration hot path: one pass over an activation for min, max, NaN/Inf and a |x| histogram.

The histogram has a fixed number of bins (a power of two) over ``[0, R)`` where ``R = 2**exponent``.
A value's bin is ``floor(|x| * 2**(log2_bins - exponent))``: a multiplication by a power of two,
exact in float64, so the bin of every value is fully determined by the value and ``R``. When a
value reaches ``R``, ``R`` doubles (or grows by ``2**k``) and bins merge in aligned groups, which
gives exactly the counts that binning everything at the larger ``R`` would have given. The final
histogram therefore depends only on the multiset of values seen, never on batch size or order.

Two implementations give bit-identical results: a numba kernel (extra ``fast``), fused into one
pass over memory, and a chunked NumPy fallback. :func:`scan` picks numba when it imports.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from quantdbg import _optional

EXPONENT_UNSET = -200
"""Exponent of a histogram that has seen no non-zero value: ``2**-200`` is below every non-zero
float32 magnitude (the smallest is ``2**-149``), so the first non-zero value always grows it."""

_NUMPY_CHUNK = 1 << 20  # elements per NumPy step: bounds the float64/int64 temporaries to ~16 MB


@dataclass(frozen=True)
class ScanResult:
    """What one pass over an array found (the histogram is updated in place).

    Attributes:
        exponent: Histogram range exponent after the pass (``R = 2**exponent``).
        lo: Smallest finite value (``+inf`` when there was none).
        hi: Largest finite value (``-inf`` when there was none).
        finite: Finite values seen.
        nonfinite: NaN/Inf values seen (left out of every other field).
    """

    exponent: int
    lo: float
    hi: float
    finite: int
    nonfinite: int


def range_exponent(absmax: float) -> int:
    """Returns the smallest ``e`` with ``absmax < 2**e`` (``absmax`` finite and > 0)."""
    return math.frexp(absmax)[1]


def merge_bins(hist: np.ndarray, shift: int) -> None:
    """Grows a histogram's range by ``2**shift`` in place: aligned groups of ``2**shift`` bins merge.

    Args:
        hist: int64 counts; its length is a power of two.
        shift: How many doublings (>= 0).
    """
    if shift <= 0:
        return
    n = hist.shape[0]
    if shift >= n.bit_length() - 1:
        total = hist.sum()
        hist[:] = 0
        hist[0] = total
        return
    kept = n >> shift
    hist[:kept] = hist.reshape(kept, 1 << shift).sum(axis=1)
    hist[kept:] = 0


def scan_numpy(x: np.ndarray, hist: np.ndarray | None, exponent: int) -> ScanResult:
    """Pure-NumPy pass (the reference; same counts as :func:`scan_numba`).

    Args:
        x: float32 values, any shape (C-contiguous preferred).
        hist: int64 histogram to add into (length a power of two), or None for min/max only.
        exponent: Current range exponent of ``hist``.

    Returns:
        The pass's :class:`ScanResult`.
    """
    flat = x.reshape(-1)
    lo, hi, finite, bad = math.inf, -math.inf, 0, 0
    log2_bins = hist.shape[0].bit_length() - 1 if hist is not None else 0
    for start in range(0, flat.size, _NUMPY_CHUNK):
        chunk = flat[start:start + _NUMPY_CHUNK]
        mask = np.isfinite(chunk)
        n_ok = int(np.count_nonzero(mask))
        bad += chunk.size - n_ok
        if n_ok == 0:
            continue
        values = chunk if n_ok == chunk.size else chunk[mask]
        finite += n_ok
        lo, hi = min(lo, float(values.min())), max(hi, float(values.max()))
        if hist is None:
            continue
        mags = np.abs(values).astype(np.float64)
        top = float(mags.max())
        if top >= math.ldexp(1.0, exponent):
            new = range_exponent(top)
            merge_bins(hist, new - exponent)
            exponent = new
        mags *= math.ldexp(1.0, log2_bins - exponent)
        hist += np.bincount(mags.astype(np.int64), minlength=hist.shape[0])
    return ScanResult(exponent, lo, hi, finite, bad)


def _scan_hist_kernel(x: np.ndarray, hist: np.ndarray, exponent: int) -> tuple:
    """The fused loop, compiled by numba on first use (plain Python here, so numba stays lazy).

    Merging lives inline (not in a helper) because a jitted function can only call other jitted
    functions, and this one is compiled from a plain module-level function to keep ``cache=True``.
    """
    n_bins = hist.shape[0]
    log2_bins = 0
    while (1 << log2_bins) < n_bins:
        log2_bins += 1
    limit = math.ldexp(1.0, exponent)
    scale = math.ldexp(1.0, log2_bins - exponent)
    lo, hi, bad = np.inf, -np.inf, 0
    for i in range(x.size):
        v = x[i]
        a = abs(np.float64(v))
        # One comparison screens NaN, Inf and out-of-range values off the common path.
        if not (a < limit):
            if not math.isfinite(a):
                bad += 1
                continue
            new = math.frexp(a)[1]
            shift = new - exponent
            if shift >= log2_bins:
                total = hist.sum()
                hist[:] = 0
                hist[0] = total
            else:
                group = 1 << shift
                kept = n_bins >> shift
                for k in range(kept):
                    acc = 0
                    for j in range(k * group, (k + 1) * group):
                        acc += hist[j]
                    hist[k] = acc
                hist[kept:] = 0
            exponent = new
            limit = math.ldexp(1.0, exponent)
            scale = math.ldexp(1.0, log2_bins - exponent)
        lo = v if v < lo else lo
        hi = v if v > hi else hi
        hist[np.int64(a * scale)] += 1
    return exponent, lo, hi, x.size - bad, bad


_NUMBA_KERNEL: Callable[..., Any] | None = None


def numba_available() -> bool:
    """True when numba imports (the ``fast`` extra)."""
    return _optional.is_available("numba")


def scan_minmax(x: np.ndarray) -> ScanResult:
    """Min, max and NaN/Inf count without a histogram (NumPy's SIMD reductions; no JIT needed).

    Args:
        x: float32 values, any shape.

    Returns:
        The pass's :class:`ScanResult` (``exponent`` is :data:`EXPONENT_UNSET`).
    """
    flat = x.reshape(-1)
    if flat.size == 0:
        return ScanResult(EXPONENT_UNSET, math.inf, -math.inf, 0, 0)
    lo, hi = float(flat.min()), float(flat.max())
    if math.isfinite(lo) and math.isfinite(hi):  # NaN propagates through min/max: none here
        return ScanResult(EXPONENT_UNSET, lo, hi, flat.size, 0)
    return scan_numpy(flat, None, EXPONENT_UNSET)


def scan_numba(x: np.ndarray, hist: np.ndarray, exponent: int) -> ScanResult:
    """Fused one-pass numba kernel; same result as :func:`scan_numpy`.

    Args:
        x: float32 values, any shape.
        hist: int64 histogram to add into (length a power of two).
        exponent: Current range exponent of ``hist``.

    Returns:
        The pass's :class:`ScanResult`.

    Raises:
        MissingDependencyError: numba is not installed.
    """
    global _NUMBA_KERNEL
    if _NUMBA_KERNEL is None:
        numba = _optional.load("numba", "fast")
        _NUMBA_KERNEL = numba.njit(cache=True, nogil=True)(_scan_hist_kernel)
    flat = np.ascontiguousarray(x).reshape(-1)
    exponent, lo, hi, finite, bad = _NUMBA_KERNEL(flat, hist, exponent)
    return ScanResult(int(exponent), float(lo), float(hi), int(finite), int(bad))


def scan(x: np.ndarray, hist: np.ndarray | None, exponent: int) -> ScanResult:
    """One pass over ``x`` with the fastest available implementation.

    Min/max only uses NumPy reductions; a histogram uses the numba kernel when numba imports,
    else the NumPy fallback (same counts either way).

    Args:
        x: float32 values, any shape.
        hist: int64 histogram to add into, or None for min/max only.
        exponent: Current range exponent of ``hist``.

    Returns:
        The pass's :class:`ScanResult`.
    """
    if hist is None:
        return scan_minmax(x)
    if numba_available():
        return scan_numba(x, hist, exponent)
    return scan_numpy(x, hist, exponent)
