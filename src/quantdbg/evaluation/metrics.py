"""Output-difference metrics: SQNR, cosine, relative L2 and max-abs of a test output vs a reference.

Everything accumulates in float64 over batches, per output and aggregated over all outputs, so
the result does not depend on how the samples were batched. Degenerate signals have defined
results rather than NaN:

=====================  =========  ======  ==========  ========
case                   sqnr_db    cosine  rel_l2      max_abs
=====================  =========  ======  ==========  ========
identical (incl. 0=0)  +inf       1.0     0.0         0.0
reference all zero     -inf       0.0     +inf        max|t|
test all zero          0.0        0.0     1.0         max|r|
non-finite test value  -inf       0.0     +inf        +inf
=====================  =========  ======  ==========  ========

Infinite values travel through JSON as the strings ``"inf"`` / ``"-inf"``.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Literal, cast, get_args

import numpy as np

from quantdbg._json import Serializable
from quantdbg.errors import DataError, check_choice
from quantdbg.quant_math import sqnr_db

MetricName = Literal["sqnr", "cosine", "sample_cosine", "rel_l2", "max_abs"]
"""Output metrics: ``sqnr`` (dB), global ``cosine`` of the flattened outputs, ``sample_cosine``
(mean over samples on axis 0 of each sample's cosine), ``rel_l2`` (||t - r|| / ||r||), ``max_abs``."""

METRIC_NAMES: tuple[str, ...] = get_args(MetricName)
HIGHER_IS_BETTER: Mapping[str, bool] = MappingProxyType(
    {"sqnr": True, "cosine": True, "sample_cosine": True, "rel_l2": False, "max_abs": False})


def check_metric_name(name: str) -> MetricName:
    """Returns ``name`` when it is an output metric.

    Raises:
        ConfigError: ``name`` is not one of :data:`METRIC_NAMES`.
    """
    return cast(MetricName, check_choice("output metric", name, METRIC_NAMES))


@dataclass(frozen=True)
class OutputMetrics(Serializable):
    """How far a test tensor (or set of tensors) is from its reference.

    Attributes:
        sqnr_db: 10 log10(sum r^2 / sum (t - r)^2).
        cosine: Cosine similarity of the flattened tensors.
        sample_cosine: Mean over samples (axis 0) of each sample's cosine (None when computed from
            pooled sums, see :func:`metrics_from_sums`).
        min_sample_cosine: The worst sample's cosine (None likewise).
        rel_l2: ||t - r|| / ||r||.
        max_abs: max |t - r|.
        count: Number of elements compared.
        nonfinite: Elements where the test value is NaN/Inf and the reference is finite.
    """

    sqnr_db: float
    cosine: float
    sample_cosine: float | None
    min_sample_cosine: float | None
    rel_l2: float
    max_abs: float
    count: int
    nonfinite: int = 0

    def value(self, name: MetricName) -> float:
        """Returns the metric called ``name`` (see :data:`MetricName`); NaN when not computed."""
        check_metric_name(name)
        value = {"sqnr": self.sqnr_db, "cosine": self.cosine, "sample_cosine": self.sample_cosine,
                 "rel_l2": self.rel_l2, "max_abs": self.max_abs}[name]
        return math.nan if value is None else value


@dataclass
class _Sums:
    """Float64 running sums for one tensor (or the aggregate)."""

    signal: float = 0.0   # sum r^2
    noise: float = 0.0    # sum (t - r)^2
    dot: float = 0.0      # sum r * t
    test: float = 0.0     # sum t^2
    max_abs: float = 0.0
    count: int = 0
    nonfinite: int = 0

    def add(self, other: _Sums) -> None:
        self.signal += other.signal
        self.noise += other.noise
        self.dot += other.dot
        self.test += other.test
        self.max_abs = max(self.max_abs, other.max_abs)
        self.count += other.count
        self.nonfinite += other.nonfinite


@dataclass(frozen=True)
class _SampleSums:
    """Per-sample float64 sums (one entry per sample on axis 0)."""

    ref_sq: np.ndarray
    test_sq: np.ndarray
    dot: np.ndarray
    bad: np.ndarray  # bool: the sample holds a non-finite test value

    def cosines(self) -> np.ndarray:
        # Vectorised cosine_of: 1 where both are zero, 0 where exactly one is.
        both = (self.ref_sq == 0.0) & (self.test_sq == 0.0)
        norm = np.sqrt(self.ref_sq * self.test_sq)
        with np.errstate(divide="ignore", invalid="ignore"):
            cos = np.where(norm > 0.0, self.dot / np.where(norm > 0.0, norm, 1.0), 0.0)
        cos = np.clip(cos, -1.0, 1.0)
        cos[both] = 1.0
        cos[np.asarray(self.bad, dtype=bool)] = 0.0
        return cos


def _batch_sums(ref: np.ndarray, test: np.ndarray) -> tuple[_Sums, _SampleSums]:
    rows = ref.shape[0] if ref.ndim else 1
    r = np.asarray(ref, dtype=np.float64).reshape(rows, -1)
    t = np.asarray(test, dtype=np.float64).reshape(rows, -1)
    bad = ~np.isfinite(t) & np.isfinite(r)
    nonfinite = int(bad.sum())
    if nonfinite:
        t = np.where(bad, 0.0, t)  # keeps the other sums finite; the count marks the result
    diff = t - r
    per_sample = _SampleSums(np.einsum("ij,ij->i", r, r), np.einsum("ij,ij->i", t, t),
                             np.einsum("ij,ij->i", r, t), np.asarray(bad.any(axis=1)))
    sums = _Sums(signal=float(per_sample.ref_sq.sum()), noise=float(np.einsum("ij,ij->", diff, diff)),
                 dot=float(per_sample.dot.sum()), test=float(per_sample.test_sq.sum()),
                 max_abs=float(np.abs(diff).max()) if diff.size else 0.0,
                 count=int(diff.size), nonfinite=nonfinite)
    return sums, per_sample


def cosine_of(ref_sq: float, test_sq: float, dot: float) -> float:
    """Cosine from sum r^2, sum t^2 and sum r*t: 1 when both are zero, 0 when one is."""
    if ref_sq == 0.0 and test_sq == 0.0:
        return 1.0
    if ref_sq == 0.0 or test_sq == 0.0:
        return 0.0
    return float(min(1.0, max(-1.0, dot / math.sqrt(ref_sq * test_sq))))


def _finish(sums: _Sums, sample_cos: np.ndarray) -> OutputMetrics:
    if sums.nonfinite:
        return OutputMetrics(-math.inf, 0.0, float(sample_cos.mean()) if sample_cos.size else 0.0,
                             float(sample_cos.min()) if sample_cos.size else 0.0, math.inf, math.inf,
                             sums.count, sums.nonfinite)
    if sums.noise == 0.0:
        rel = 0.0
    elif sums.signal == 0.0:
        rel = math.inf
    else:
        rel = math.sqrt(sums.noise / sums.signal)
    return OutputMetrics(
        sqnr_db=sqnr_db(sums.signal, sums.noise), cosine=cosine_of(sums.signal, sums.test, sums.dot),
        sample_cosine=float(sample_cos.mean()) if sample_cos.size else 1.0,
        min_sample_cosine=float(sample_cos.min()) if sample_cos.size else 1.0,
        rel_l2=rel, max_abs=sums.max_abs, count=sums.count, nonfinite=0)


def metrics_from_sums(signal: float, noise: float, dot: float, test: float, max_abs: float,
                      count: int) -> OutputMetrics:
    """Metrics from float64 sums computed elsewhere (e.g. inside an ONNX graph).

    Per-sample cosines cannot be recovered from pooled sums, so ``sample_cosine`` and
    ``min_sample_cosine`` are None.

    Args:
        signal: sum r^2.
        noise: sum (t - r)^2.
        dot: sum r * t.
        test: sum t^2.
        max_abs: max |t - r| (NaN/Inf marks a non-finite test value).
        count: Elements compared.

    Returns:
        The metrics, with the zero-signal conventions of this module.
    """
    bad = not all(math.isfinite(v) for v in (signal, noise, dot, test, max_abs))
    sums = _Sums(float(signal), float(noise), float(dot), float(test), float(max_abs), int(count),
                 nonfinite=1 if bad else 0)
    result = _finish(sums, np.array([math.nan]))
    return replace(result, sample_cosine=None, min_sample_cosine=None)


def compare_arrays(ref: np.ndarray, test: np.ndarray) -> OutputMetrics:
    """Compares one test array with its reference.

    Args:
        ref: Reference values (e.g. the FP32 output); axis 0 indexes samples.
        test: Values to judge, same shape.

    Returns:
        The metrics.

    Raises:
        DataError: The shapes differ.
    """
    acc = MetricAccumulator()
    acc.update({"x": ref}, {"x": test})
    return acc.result().total


@dataclass(frozen=True)
class Comparison(Serializable):
    """Metrics per output and over all outputs together.

    Attributes:
        outputs: Output name -> metrics, in the order first seen.
        total: Every output's elements pooled (per-sample cosine pools each sample's elements
            across outputs when all outputs have the same number of samples).
    """

    outputs: Mapping[str, OutputMetrics]
    total: OutputMetrics

    def __post_init__(self) -> None:
        object.__setattr__(self, "outputs", MappingProxyType(dict(self.outputs)))


class MetricAccumulator:
    """Streams batches of (reference, test) outputs into float64 sums.

    Example::

        acc = MetricAccumulator()
        for ref, test in zip(reference_batches, test_batches):
            acc.update(ref, test)
        acc.result().total.sqnr_db
    """

    def __init__(self) -> None:
        self._sums: dict[str, _Sums] = {}
        self._samples: dict[str, list[_SampleSums]] = {}

    def update(self, ref: Mapping[str, np.ndarray], test: Mapping[str, np.ndarray]) -> None:
        """Adds one batch.

        Args:
            ref: Output name -> reference batch.
            test: Output name -> test batch; must hold every name of ``ref`` with the same shape.

        Raises:
            DataError: An output is missing from ``test`` or its shape differs.
        """
        for name, r in ref.items():
            if name not in test:
                raise DataError(f"Output {name!r} is missing from the outputs being compared "
                                f"(got {sorted(test)}); both sides must produce the same outputs.")
            r_arr, t_arr = np.asarray(r), np.asarray(test[name])
            if r_arr.shape != t_arr.shape:
                raise DataError(f"Output {name!r}: reference shape {r_arr.shape} differs from "
                                f"compared shape {t_arr.shape}; compare outputs of the same batch.")
            sums, per_sample = _batch_sums(r_arr, t_arr)
            self._sums.setdefault(name, _Sums()).add(sums)
            self._samples.setdefault(name, []).append(per_sample)

    def result(self) -> Comparison:
        """Returns the metrics of everything added so far.

        Raises:
            DataError: Nothing was added.
        """
        if not self._sums:
            raise DataError("No outputs were compared: the evaluation data yielded no batches.")
        samples = {name: _concat(parts) for name, parts in self._samples.items()}
        outputs = {name: _finish(s, samples[name].cosines()) for name, s in self._sums.items()}
        total = _Sums()
        for s in self._sums.values():
            total.add(s)
        if len({len(p.bad) for p in samples.values()}) == 1:
            pooled = _SampleSums(*(sum(getattr(p, f) for p in samples.values())
                                   for f in ("ref_sq", "test_sq", "dot", "bad")))
            cos = pooled.cosines()
        else:  # outputs disagree on the number of samples: each output's samples count alone
            cos = np.concatenate([p.cosines() for p in samples.values()])
        return Comparison(outputs, _finish(total, cos))


def _concat(parts: list[_SampleSums]) -> _SampleSums:
    return _SampleSums(*(np.concatenate([getattr(p, f) for p in parts])
                         for f in ("ref_sq", "test_sq", "dot", "bad")))


def compare_outputs(reference: list[Mapping[str, np.ndarray]],
                    test: list[Mapping[str, np.ndarray]]) -> Comparison:
    """Compares batch lists output by output (see :class:`MetricAccumulator`).

    Args:
        reference: One output dict per batch (e.g. from the FP32 model).
        test: The same batches from the model being judged.

    Returns:
        Per-output and pooled metrics.

    Raises:
        DataError: The lists differ in length, or an output is missing or differs in shape.
    """
    if len(reference) != len(test):
        raise DataError(f"{len(reference)} reference batches but {len(test)} compared batches; "
                        "run both models on the same data.")
    acc = MetricAccumulator()
    for r, t in zip(reference, test, strict=True):
        acc.update(r, t)
    return acc.result()
