"""The calibration hot path: one pass over an activation for min, max, NaN/Inf and a |x| histogram.

The histogram has a fixed number of bins (a power of two) over ``[0, R)`` where ``R = 2**exponent``.
A value's bin is ``floor(|x| * 2**(log2_bins - exponent))``: a multiplication by a power of two,
exact in float64, so the bin of every value is fully determined by the value and ``R``. When a
value reaches ``R``, ``R`` doubles (or grows by ``2**k``) and bins merge in aligned groups, which
gives exactly the counts that binning everything at the larger ``R`` would have given. The final
histogram therefore depends only on the multiset of values seen, never on batch size or order.

Two implementations give bit-identical results: a numba kernel (extra ``fast``), fused into one
pass over memory, and a chunked NumPy path. :func:`scan` uses NumPy until enough data has gone by
that loading numba pays off, then numba.
"""
from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from quantdbg import _optional

logger = logging.getLogger(__name__)

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
        if chunk.size == 0:
            continue
        c_lo, c_hi = float(chunk.min()), float(chunk.max())
        if not (math.isfinite(c_lo) and math.isfinite(c_hi)):  # NaN/Inf propagate: rare, masked path
            chunk = chunk[np.isfinite(chunk)]
            bad += flat[start:start + _NUMPY_CHUNK].size - chunk.size
            if chunk.size == 0:
                continue
            c_lo, c_hi = float(chunk.min()), float(chunk.max())
        finite += chunk.size
        lo, hi = min(lo, c_lo), max(hi, c_hi)
        if hist is None:
            continue
        top = max(-c_lo, c_hi)
        if top >= math.ldexp(1.0, exponent):
            new = range_exponent(top)
            merge_bins(hist, new - exponent)
            exponent = new
        hist += np.bincount(_bin_indices(chunk, log2_bins - exponent), minlength=hist.shape[0])
    return ScanResult(exponent, lo, hi, finite, bad)


def _bin_indices(values: np.ndarray, shift: int) -> np.ndarray:
    """``floor(|values| * 2**shift)`` for finite values below the histogram's range.

    Scaling by a power of two is exact in float32 unless the scale itself leaves float32's normal
    range (then float64), so the bins equal the numba kernel's float64 ones. The float32 path
    works in per-thread scratch buffers: fresh multi-MB temporaries cost a page fault per 4 KB.
    """
    if not -126 <= shift <= 127:
        mags = np.abs(values).astype(np.float64)
        mags *= math.ldexp(1.0, shift)
        return mags.astype(np.intp)
    mags, bins = _scratch(values.size)
    np.abs(values, out=mags)
    mags *= np.float32(math.ldexp(1.0, shift))
    np.copyto(bins, mags, casting="unsafe")  # truncation toward zero = floor, the values are >= 0
    return bins


_SCRATCH = threading.local()


def _scratch(size: int) -> tuple[np.ndarray, np.ndarray]:
    """This thread's float32 and intp buffers, viewed at ``size`` elements (<= one NumPy chunk)."""
    if getattr(_SCRATCH, "mags", None) is None:
        _SCRATCH.mags = np.empty(_NUMPY_CHUNK, np.float32)
        _SCRATCH.bins = np.empty(_NUMPY_CHUNK, np.intp)
    return _SCRATCH.mags[:size], _SCRATCH.bins[:size]


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


_WARMUP_AFTER_BYTES = 256 << 20
"""Histogrammed bytes after which numba is loaded, in a background thread. Loading it costs about
0.6 s and it then scans about twice as fast as NumPy, so for a small model and data set NumPy alone
finishes first; both give the same counts, so switching mid-stream changes nothing."""


class _NumbaGate:
    """Hands out the numba kernel once it is loaded; loads it in the background once enough data
    has gone through NumPy that loading pays for itself."""

    def __init__(self) -> None:
        self.kernel: Callable[..., Any] | None = None
        self._scanned = 0
        self._loader: threading.Thread | None = None
        self._lock = threading.Lock()

    def kernel_for(self, nbytes: int) -> Callable[..., Any] | None:
        """The kernel when ready, else None (and start loading once past the threshold)."""
        if self.kernel is not None:
            return self.kernel
        with self._lock:
            self._scanned += nbytes
            if self._loader is None and self._scanned >= _WARMUP_AFTER_BYTES:
                self._loader = threading.Thread(target=self._load_quietly, name="quantdbg-numba", daemon=True)
                self._loader.start()
        return None

    def load(self) -> Callable[..., Any]:
        """Loads (compiles on first use, else reads numba's cache) and returns the kernel."""
        if self.kernel is None:
            numba = _optional.load("numba", "fast")
            kernel = numba.njit(cache=True, nogil=True)(_scan_hist_kernel)
            kernel(np.zeros(1, np.float32), np.zeros(2, np.int64), EXPONENT_UNSET)  # the signature used
            self.kernel = kernel
        return self.kernel

    def _load_quietly(self) -> None:
        if not numba_available():  # importing numba takes ~0.3 s: asked only past the threshold
            return
        try:
            self.load()
        except Exception as exc:  # noqa: BLE001 -- NumPy keeps going; the result is the same
            logger.warning("numba kernel could not be loaded (%s); histograms stay on NumPy.", exc)


_NUMBA = _NumbaGate()


def numba_available() -> bool:
    """True when numba imports (the ``fast`` extra)."""
    return _optional.is_available("numba")


def preload_numba() -> None:
    """Loads the numba kernel now, in this thread (when numba is installed), instead of after the
    first few hundred MB of activations. For long-running processes and reproducible peak memory.

    Raises:
        MissingDependencyError: numba is not installed.
    """
    _NUMBA.load()


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
    flat = np.ascontiguousarray(x).reshape(-1)
    exponent, lo, hi, finite, bad = _NUMBA.load()(flat, hist, exponent)
    return ScanResult(int(exponent), float(lo), float(hi), int(finite), int(bad))


def scan(x: np.ndarray, hist: np.ndarray | None, exponent: int) -> ScanResult:
    """One pass over ``x`` with the fastest available implementation.

    Min/max only uses NumPy reductions. A histogram uses the numba kernel once it is loaded (in the
    background, after the first :data:`_WARMUP_AFTER_BYTES` of data, when numba imports), NumPy
    until then; the counts are the same either way.

    Args:
        x: float32 values, any shape.
        hist: int64 histogram to add into, or None for min/max only.
        exponent: Current range exponent of ``hist``.

    Returns:
        The pass's :class:`ScanResult`.
    """
    if hist is None:
        return scan_minmax(x)
    if _NUMBA.kernel_for(x.nbytes) is not None:
        return scan_numba(x, hist, exponent)
    return scan_numpy(x, hist, exponent)
