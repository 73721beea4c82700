"""``mse``: the clip that minimises the expected squared quantization error over the histogram.

Values are taken as uniform within each histogram bin. For a clip ``t`` (a bin edge) and step
``s = t / 127`` the expected error of a value ``u`` is

- clipping, ``u > t``: ``(u - t)^2``, integrated exactly over each clipped bin;
- rounding to zero, bins touching ``[0, s/2)``: integrated exactly with the antiderivative of the
  squared sawtooth, ``F(u) = m s^3/12 + r^3/3`` (``m = round(u/s)``, ``r = u - m s``), because the
  zeros after a ReLU round without error and a flat ``s^2/12`` would overstate them;
- other in-range bins: ``s^2 / 12`` (uniform rounding noise).

Clipping and the flat rounding term are prefix/suffix sums, so every candidate is evaluated at
once in O(bins); the exact zero-zone term touches at most ``ceil(bins / 254)`` bins per candidate.
"""
from __future__ import annotations

import numpy as np

from quantdbg._calibrator_specs import MseConfig
from quantdbg.calibration.calibrators.calibrator import CandidateCalibrator
from quantdbg.quant_math import QMAX

"""Largest magnitude of symmetric INT8."""


class MseCalibrator(CandidateCalibrator):
    """Least expected squared error (clipping + rounding) over the bin-edge candidates."""

    name = "mse"
    config_class = MseConfig

    def scores(self, counts: np.ndarray, start_bin: int) -> tuple[np.ndarray, np.ndarray]:
        """The expected squared error of every candidate clip."""
        return mse_errors(counts, start_bin)


def mse_errors(counts: np.ndarray, start_bin: int = 128) -> tuple[np.ndarray, np.ndarray]:
    """Expected squared error (in squared bin widths, summed over values) of every candidate clip.

    Args:
        counts: |x| histogram counts.
        start_bin: First candidate edge (clamped to the number of bins).

    Returns:
        ``(candidates, error)``: candidate edges ``k`` (clip ``t = k * width``) and the error of each.
    """
    n_j = np.asarray(counts, dtype=np.float64)
    n = n_j.shape[0]
    j = np.arange(n, dtype=np.float64)
    cand = np.arange(max(1, min(start_bin, n)), n + 1, dtype=np.int64)
    k = cand.astype(np.float64)
    step = k / QMAX

    def suffix(values: np.ndarray) -> np.ndarray:  # suffix[m] = sum(values[m:])
        return np.concatenate((np.cumsum(values[::-1])[::-1], [0.0]))

    t0, t1, t2 = suffix(n_j)[cand], suffix(n_j * j)[cand], suffix(n_j * j * j)[cand]
    clip = t2 + (1.0 - 2.0 * k) * t1 + (k * k - k + 1.0 / 3.0) * t0

    zone = np.ceil(step / 2.0).astype(np.int64)      # bins [0, zone) touch [0, s/2)
    inside = suffix(n_j)[0] - t0                     # values below the clip
    flat = (inside - (suffix(n_j)[0] - suffix(n_j)[zone])) * step * step / 12.0

    width = int(zone.max())
    cols = np.arange(width)
    in_zone = cols[None, :] < zone[:, None]
    lo = cols[None, :].astype(np.float64)
    exact = (_sawtooth_integral(lo + 1.0, step[:, None]) - _sawtooth_integral(lo, step[:, None]))
    zero_zone = np.where(in_zone, exact * n_j[:width][None, :], 0.0).sum(axis=1)
    return cand, clip + flat + zero_zone


def _sawtooth_integral(u: np.ndarray, step: np.ndarray) -> np.ndarray:
    """``integral_0^u (v - step * round(v / step))^2 dv`` for ``u >= 0``."""
    m = np.floor(u / step + 0.5)
    r = u - m * step
    return m * step ** 3 / 12.0 + r ** 3 / 3.0
