"""``entropy``: TensorRT's / pytorch-quantization's KL-divergence calibration, vectorised.

For each candidate threshold bin ``i`` (from ``start_bin`` to the last bin), pytorch-quantization's
``_compute_amax_entropy`` builds

- ``P``: the first ``i`` bins, with the mass of every clipped bin added to the last one;
- ``Q``: the first ``i`` bins merged into 128 levels (bin ``j`` goes to level ``floor(128 j / i)``),
  each level's mass spread evenly over its *non-empty* bins only, empty bins staying empty;

and takes ``KL(P || Q)`` as ``scipy.stats.entropy`` does (both normalised; ``inf`` where ``P > 0``
and ``Q = 0``). The threshold is the upper edge of bin ``i`` for the *last* ``i`` of least
divergence. Before all this, bin 0 is given the count of bin 1 (as pytorch-quantization does), so
the spike of exact zeros after a ReLU does not dominate.

The loop above is O(bins^2) in Python. Here every candidate is done at once: with prefix sums of
the counts, of the non-empty-bin indicator and of ``n log n``, each level's mass and size is a
difference of two prefix sums, and ``KL = sum P log P / T - log T - sum P log Q / T + log H``
(``T`` total mass, ``H`` unclipped mass) needs only per-level terms. One deviation: where every
value is clipped (``H = 0``) scipy gives NaN, which ``argmin`` would pick; here it is ``inf``.
"""
from __future__ import annotations

import numpy as np

from quantdbg._calibrator_specs import NUM_LEVELS, EntropyConfig
from quantdbg.calibration.calibrators.calibrator import CandidateCalibrator
from quantdbg.errors import ConfigError


class EntropyCalibrator(CandidateCalibrator):
    """Minimum KL divergence between the clipped |x| distribution and its 128-level version."""

    name = "entropy"
    config_class = EntropyConfig

    def scores(self, counts: np.ndarray, start_bin: int) -> tuple[np.ndarray, np.ndarray]:
        """The KL divergence of every candidate threshold bin."""
        return entropy_divergences(counts, start_bin)


def entropy_divergences(counts: np.ndarray, start_bin: int = 128,
                        levels: int = NUM_LEVELS) -> tuple[np.ndarray, np.ndarray]:
    """KL divergence of every candidate threshold bin, vectorised.

    Args:
        counts: |x| histogram counts (the last bin holds max|x|).
        start_bin: First candidate (clamped to the number of bins).
        levels: Quantized levels Q is merged into.

    Returns:
        ``(candidates, divergence)``: candidate bins ``i`` (threshold = upper edge of bin ``i-1``,
        i.e. edge ``i``) and ``KL(P_i || Q_i)`` for each (``inf`` where undefined).
    """
    bins = np.asarray(counts, dtype=np.float64).copy()
    n = bins.shape[0]
    if n >= 2:
        bins[0] = bins[1]
    total = float(bins.sum())
    if levels & (levels - 1):
        raise ConfigError(f"levels must be a power of two, got {levels}.")
    cand = np.arange(max(1, min(start_bin, n)), n + 1, dtype=np.int64)
    prefix = np.concatenate(([0.0], np.cumsum(bins)))
    prefix_nz = np.concatenate(([0.0], np.cumsum(bins > 0, dtype=np.float64)))
    xlogx = np.where(bins > 0, bins * np.log(np.where(bins > 0, bins, 1.0)), 0.0)
    prefix_xlogx = np.concatenate(([0.0], np.cumsum(xlogx)))

    tail = total - prefix[cand]                      # clipped mass, folded into P's last bin
    kept = prefix[cand]                              # H: mass of Q before normalisation
    last = bins[cand - 1]
    p_last = last + tail
    sum_plogp = prefix_xlogx[cand - 1] + _xlogx(p_last)

    # Level k of candidate i spans bins [ceil(k i / L), ceil((k+1) i / L)); L is a power of two,
    # so the ceiling division is a shift.
    shift = levels.bit_length() - 1
    k = np.arange(levels + 1, dtype=np.int64)
    edges = (k[None, :] * cand[:, None] + (levels - 1)) >> shift
    at_edges = prefix[edges]
    mass = at_edges[:, 1:] - at_edges[:, :-1]
    at_edges = prefix_nz[edges]
    size = at_edges[:, 1:] - at_edges[:, :-1]
    # sum_k mass_k log(mass_k / size_k) over non-empty levels (empty: mass = size = 0 -> term 0)
    term = np.divide(mass, size, out=np.ones_like(mass), where=size > 0)
    np.log(term, out=term)
    term *= mass
    sum_plogq = term.sum(axis=1)
    k_last = (levels * (cand - 1)) // cand           # level of bin i-1
    rows = np.arange(cand.shape[0])
    mass_last, size_last = mass[rows, k_last], size[rows, k_last]
    with np.errstate(divide="ignore", invalid="ignore"):
        q_last = np.where(size_last > 0, mass_last / np.maximum(size_last, 1), 0.0)
        sum_plogq = sum_plogq + np.where(tail > 0, tail * np.log(np.where(q_last > 0, q_last, 1.0)), 0.0)
        divergence = sum_plogp / total - np.log(total) - sum_plogq / total + np.log(kept)
    undefined = (kept <= 0) | ((tail > 0) & (last <= 0))
    divergence = np.where(undefined, np.inf, divergence)
    return cand, divergence


def _xlogx(values: np.ndarray) -> np.ndarray:
    safe = np.where(values > 0, values, 1.0)
    return np.where(values > 0, values * np.log(safe), 0.0)
