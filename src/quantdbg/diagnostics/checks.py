"""The checks behind ``quantdbg doctor``: each measures one classic PTQ problem and judges it.

Every check returns a :class:`CheckOutcome`: the measurements (frozen dataclasses, also what the
report plots) and the findings they justify, each with its evidence and a fix. A check that finds
nothing returns no finding; the thresholds live in :class:`quantdbg.doctor.DoctorConfig`.
"""
from __future__ import annotations

import math
import warnings
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Literal, get_args

import numpy as np
import onnx
from onnx import numpy_helper

from quantdbg._json import decode_float, encode_float
from quantdbg.calibration import calibrator_amaxes
from quantdbg.config import TensorKind
from quantdbg.errors import NotCalibratedError, QuantDbgWarning
from quantdbg.quant_math import QMAX, channel_axis, channel_scale, nsr, sqnr_db, zeroed_fraction

if TYPE_CHECKING:
    from quantdbg.calibration import CalibrationResult, TensorStats
    from quantdbg.qdq import QuantizedModel
    from quantdbg.sensitivity import SensitivityReport

CheckName = Literal["sensitive_layers", "weight_zeroing", "calibrator_disagreement", "calibration_size",
                    "mixed_ranges", "qdq_fusion"]
CHECKS: tuple[CheckName, ...] = get_args(CheckName)
Severity = Literal["high", "medium", "low", "info"]
SEVERITIES: tuple[Severity, ...] = get_args(Severity)
Cell = str | int | float | bool | None
MIN_ALIVE = 0.1
"""A channel is examined for zeroing only when at least this share of its values is significant
(``|x| >= SIGNIFICANT * amax``): mostly-zero channels after a Relu, or dead ones, lose nothing."""
SIGNIFICANT = 1e-4
MIXED_RATIO = 16.0
"""A swamped channel's max|x| is at most the largest channel's / this: its range differs from the
tensor's by 4 bits or more (a Softmax's channels all reach ~1 and mix nothing)."""
PLOT_BINS = 256
"""Histogram resolution kept for plots (the collected histograms have tens of thousands of bins)."""


def _from_json(value: float | str | None) -> float:
    """Decodes a float written by ``encode_float`` (None, which it never writes for a float, as nan)."""
    return math.nan if value is None else decode_float(value, "")


def _json_cell(value: Cell) -> Cell:
    return encode_float(value) if isinstance(value, float) else value


@dataclass(frozen=True)
class Evidence:
    """A small table backing a finding.

    Attributes:
        columns: Column headers.
        rows: One tuple per row, as long as ``columns``.
    """

    columns: tuple[str, ...]
    rows: tuple[tuple[Cell, ...], ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (non-finite floats as strings)."""
        return {"columns": list(self.columns), "rows": [[_json_cell(v) for v in row] for row in self.rows]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Evidence:
        """Inverse of :meth:`to_dict` (non-finite floats come back as their strings' values)."""
        def cell(v: Any) -> Cell:
            return float(v) if v in ("inf", "-inf", "nan") else v
        return cls(tuple(data["columns"]), tuple(tuple(cell(v) for v in row) for row in data["rows"]))


@dataclass(frozen=True)
class Finding:
    """One diagnosis.

    Attributes:
        check: The check that made it.
        severity: ``"high"`` (accuracy is being lost now), ``"medium"``, ``"low"`` or ``"info"``.
        score: Orders findings of one severity (larger = more serious).
        title: One line saying what is wrong and where.
        subjects: The nodes or tensors named.
        evidence: The numbers behind it.
        fix: What to do about it.
    """

    check: CheckName
    severity: Severity
    score: float
    title: str
    subjects: tuple[str, ...]
    evidence: Evidence
    fix: str

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return {"check": self.check, "severity": self.severity, "score": encode_float(self.score),
                "title": self.title, "subjects": list(self.subjects), "evidence": self.evidence.to_dict(),
                "fix": self.fix}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Finding:
        """Inverse of :meth:`to_dict`."""
        return cls(data["check"], data["severity"], _from_json(data["score"]), data["title"],
                   tuple(data["subjects"]), Evidence.from_dict(data["evidence"]), data["fix"])


def sort_findings(findings: Iterable[Finding]) -> tuple[Finding, ...]:
    """Most serious first: by severity, then score (descending), then check order."""
    return tuple(sorted(findings, key=lambda f: (SEVERITIES.index(f.severity), -_finite(f.score),
                                                  CHECKS.index(f.check), f.title)))


def _finite(value: float) -> float:
    return value if math.isfinite(value) else (1e300 if value > 0 else -1e300)


@dataclass(frozen=True)
class CheckOutcome:
    """What one check measured and concluded.

    Attributes:
        findings: Findings (empty when the check found nothing wrong).
        data: The measurements, one dataclass per node/tensor (check-specific types).
    """

    findings: tuple[Finding, ...] = ()
    data: tuple[Any, ...] = ()


# --------------------------------------------------------------------------------------------
# Weights zeroed by their range
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class WeightZeroing:
    """How many weights of one node round to zero in INT8.

    Attributes:
        node: Consumer node.
        op_type: Its op type.
        tensor: The weight initializer.
        nonzero: Non-zero FP32 weights.
        per_tensor: Share of them that quantize to 0 with one scale ``max|w| / 127``.
        per_channel: The same with one scale per output channel.
        scheme: What the Q/DQ model uses: ``"per-channel"`` or ``"per-tensor"``.
    """

    node: str
    op_type: str
    tensor: str
    nonzero: int
    per_tensor: float
    per_channel: float
    scheme: Literal["per-channel", "per-tensor"]

    @property
    def actual(self) -> float:
        """The zeroed share under the scheme the model uses."""
        return self.per_channel if self.scheme == "per-channel" else self.per_tensor

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return dict(self.__dict__)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> WeightZeroing:
        """Inverse of :meth:`to_dict`."""
        return cls(**data)


def weight_zeroing(fp_model: onnx.ModelProto, qmodel: QuantizedModel) -> list[WeightZeroing]:
    """Measures, for every quantized weight, the zeroed share per tensor and per channel.

    Args:
        fp_model: The FP32 model holding the weights.
        qmodel: The Q/DQ model's records (which weights are quantized, per-channel or not).

    Returns:
        One entry per weight record whose weight is an initializer, in record order.
    """
    inits = {init.name: init for init in fp_model.graph.initializer}
    nodes = {node.name: node for node in fp_model.graph.node}
    found = []
    for record in qmodel.records:
        if record.kind is not TensorKind.WEIGHT or record.tensor not in inits:
            continue
        w = numpy_helper.to_array(inits[record.tensor]).astype(np.float64)
        if w.size == 0:
            continue
        amax = float(np.abs(w).max())
        per_tensor = zeroed_fraction(w, (amax or 1.0) / QMAX)
        node = nodes.get(record.node)
        trans_b = any(a.name == "transB" and a.i for a in (node.attribute if node is not None else ()))
        axis = channel_axis(record.op_type, w.ndim, trans_b, record.axis)
        per_channel = zeroed_fraction(w, channel_scale(w, axis)) if w.ndim else per_tensor
        scheme: Literal["per-channel", "per-tensor"] = (
            "per-channel" if len(record.scale) > 1 else "per-tensor")
        found.append(WeightZeroing(record.node, record.op_type, record.tensor, int((w != 0).sum()),
                                   per_tensor, per_channel, scheme))
    return found


def check_weight_zeroing(fp_model: onnx.ModelProto, qmodel: QuantizedModel,
                         threshold: float = 0.05) -> CheckOutcome:
    """Flags weights whose range rounds many of them to zero.

    Args:
        fp_model: The FP32 model.
        qmodel: The Q/DQ model and its records.
        threshold: Zeroed share above which a weight is named.

    Returns:
        A ``medium``/``high`` finding for weights zeroed under the scheme the model uses (high
        from 20 %), and an ``info`` finding for weights a per-tensor range would zero while the
        per-channel scales in use keep them.
    """
    items = weight_zeroing(fp_model, qmodel)
    columns = ("node", "op", "weights", "zeroed per-tensor", "zeroed per-channel", "in use")
    def row(w: WeightZeroing) -> tuple[Cell, ...]:
        return (w.node, w.op_type, w.nonzero, w.per_tensor, w.per_channel, w.scheme)
    bad = sorted((w for w in items if w.actual > threshold), key=lambda w: -w.actual)
    hidden = sorted((w for w in items if w.actual <= threshold < w.per_tensor), key=lambda w: -w.per_tensor)
    findings = []
    if bad:
        worst = bad[0]
        findings.append(Finding(
            "weight_zeroing", "high" if worst.actual >= 0.2 else "medium", worst.actual,
            f"{len(bad)} weight(s) lose {100 * worst.actual:.0f}% or less of their non-zero values to 0 in "
            f"INT8 (worst: {worst.node})", tuple(w.node for w in bad),
            Evidence(columns, tuple(row(w) for w in bad)),
            "Use per-channel weight scales (QuantConfig(per_channel=True)); where per-channel still zeroes "
            "many weights, one outlier weight stretches its channel's range: keep that node in FP16 "
            "(exclude it) or retrain/clip the outlier weights."))
    if hidden:
        worst = hidden[0]
        findings.append(Finding(
            "weight_zeroing", "info", worst.per_tensor,
            f"A per-tensor range would zero up to {100 * worst.per_tensor:.0f}% of the weights of "
            f"{len(hidden)} node(s); the per-channel scales in use keep them", tuple(w.node for w in hidden),
            Evidence(columns, tuple(row(w) for w in hidden)),
            "Keep per-channel weight scales for these nodes; a tool or TensorRT build that forces "
            "per-tensor weights would lose accuracy here."))
    return CheckOutcome(tuple(findings), tuple(items))


# --------------------------------------------------------------------------------------------
# Calibrators that disagree
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class CalibratorComparison:
    """Every calibrator's clip for one activation tensor, and the error each gives.

    Attributes:
        tensor: ONNX value name.
        chosen: The calibrator the Q/DQ model uses.
        amax: Calibrator -> clip.
        tensor_sqnr: Calibrator -> SQNR (dB) of the tensor itself quantized with that clip,
            computed from its calibration histogram.
        layer_sqnr: Calibrator -> the worst consumer layer's local output SQNR (dB) with that clip
            (from the sensitivity evidence; empty when not measured).
        best: The calibrator with the highest layer SQNR (tensor SQNR when no layer SQNR).
        ratio: Largest clip / smallest clip.
        hist: |x| histogram at plot resolution (ends at max|x|).
        hist_width: Its bin width.
    """

    tensor: str
    chosen: str
    amax: Mapping[str, float]
    tensor_sqnr: Mapping[str, float]
    layer_sqnr: Mapping[str, float]
    best: str
    ratio: float
    hist: tuple[int, ...] = ()
    hist_width: float = 0.0

    def __post_init__(self) -> None:
        for name in ("amax", "tensor_sqnr", "layer_sqnr"):
            object.__setattr__(self, name, MappingProxyType(dict(getattr(self, name))))

    @property
    def gain_db(self) -> float:
        """How much better the best calibrator is than the chosen one (dB, by the deciding SQNR)."""
        sqnr = self.layer_sqnr or self.tensor_sqnr
        if self.chosen not in sqnr or self.best not in sqnr:
            return 0.0
        return float(sqnr[self.best] - sqnr[self.chosen])

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        enc = lambda m: {k: encode_float(v) for k, v in m.items()}  # noqa: E731
        return {"tensor": self.tensor, "chosen": self.chosen, "amax": dict(self.amax),
                "tensor_sqnr": enc(self.tensor_sqnr), "layer_sqnr": enc(self.layer_sqnr), "best": self.best,
                "ratio": self.ratio, "hist": list(self.hist), "hist_width": self.hist_width}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CalibratorComparison:
        """Inverse of :meth:`to_dict`."""
        dec = lambda m: {k: _from_json(v) for k, v in m.items()}  # noqa: E731
        return cls(data["tensor"], data["chosen"], dict(data["amax"]), dec(data["tensor_sqnr"]),
                   dec(data["layer_sqnr"]), data["best"], float(data["ratio"]),
                   tuple(int(v) for v in data["hist"]), float(data["hist_width"]))


def histogram_sqnr(stats: TensorStats, amax: float) -> float:
    """SQNR (dB) of a tensor quantized to symmetric INT8 with clip ``amax``, from its |x| histogram.

    Each bin's values are taken as spread evenly over the bin: values below half a step round to
    0 (error: their own square), values beyond ``amax`` saturate (error: distance to ``amax``),
    the rest get the uniform rounding error ``step**2 / 12``.

    Args:
        stats: Statistics with a histogram.
        amax: The clip.

    Returns:
        The SQNR in dB (+inf for an all-zero tensor).

    Raises:
        NotCalibratedError: ``stats`` has no histogram.
    """
    if stats.hist is None or stats.hist_range is None:
        raise NotCalibratedError(f"Tensor {stats.name!r} has no histogram; collect it with histogram=True.")
    counts = np.asarray(stats.hist, np.float64)
    width = stats.hist_range / counts.size
    lo = np.arange(counts.size) * width
    hi = lo + width
    mean_sq = (lo * lo + lo * hi + hi * hi) / 3.0  # E[x^2] over a uniform bin
    step = amax / QMAX
    center = lo + width / 2
    clipped = (center - amax) ** 2 + width * width / 12.0
    error = np.where(hi <= step / 2, mean_sq, np.where(center <= amax, step * step / 12.0, clipped))
    return sqnr_db(float((counts * mean_sq).sum()), float((counts * error).sum()))


def _layer_sqnr(tensor: str, sensitivity: SensitivityReport | None) -> dict[str, float]:
    """Calibrator -> the worst consumer layer's local SQNR, from the sensitivity evidence."""
    found: dict[str, float] = {}
    for layer in sensitivity.layers if sensitivity is not None else ():
        if layer.evidence is None or not layer.evidence.calibrator_sqnr:
            continue
        if not any(i.tensor == tensor and i.kind is TensorKind.ACTIVATION for i in layer.inputs):
            continue
        for name, value in layer.evidence.calibrator_sqnr.items():
            found[name] = min(found.get(name, math.inf), float(value))
    return found


def compare_calibrators(calibration: CalibrationResult,
                        sensitivity: SensitivityReport | None = None) -> list[CalibratorComparison]:
    """Measures every calibrator on every activation tensor that has a histogram.

    Args:
        calibration: Ranges and statistics (histograms are needed).
        sensitivity: A report with evidence, for the consumer layers' SQNR per calibrator.

    Returns:
        One comparison per tensor, in calibration order.
    """
    found = []
    for tensor, chosen in calibration.ranges.items():
        stats = calibration.stats.get(tensor)
        if stats is None or stats.hist is None or stats.absmax == 0.0:
            continue
        amax = calibrator_amaxes(stats)
        if not amax:
            continue
        tensor_sqnr = {name: histogram_sqnr(stats, value) for name, value in amax.items()}
        layer_sqnr = _layer_sqnr(tensor, sensitivity)
        deciding = layer_sqnr or tensor_sqnr
        best = max(sorted(deciding), key=lambda k: _finite(deciding[k]))
        plot = stats.binned(PLOT_BINS)
        found.append(CalibratorComparison(
            tensor, chosen.method, amax, tensor_sqnr, layer_sqnr, best,
            max(amax.values()) / max(min(amax.values()), 1e-30), tuple(int(c) for c in plot.counts),
            float(plot.width)))
    return found


def check_calibrator_disagreement(calibration: CalibrationResult,
                                  sensitivity: SensitivityReport | None = None,
                                  ratio: float = 2.0) -> CheckOutcome:
    """Flags tensors whose calibrators disagree by more than ``ratio`` in scale.

    Args:
        calibration: Ranges and statistics with histograms.
        sensitivity: A sensitivity report with evidence (optional): the error that decides which
            calibrator is best is then the consumer layer's local output SQNR.
        ratio: Largest / smallest clip above which calibrators disagree.

    Returns:
        One finding naming the disagreeing tensors (severity by how much the best calibrator beats
        the chosen one: high from 6 dB, medium from 1 dB, else low); the data holds every tensor's
        comparison.
    """
    items = compare_calibrators(calibration, sensitivity)
    bad = sorted((c for c in items if c.ratio > ratio), key=lambda c: (-c.gain_db, -c.ratio))
    if not bad:
        return CheckOutcome((), tuple(items))
    names = sorted({m for c in bad for m in c.amax})
    columns = ("tensor", "chosen", *(f"amax {m}" for m in names), "max/min", "best", "gain (dB)")
    rows = tuple((c.tensor, c.chosen, *(c.amax.get(m) for m in names), c.ratio, c.best, c.gain_db)
                 for c in bad)
    gain = max(c.gain_db for c in bad)
    severity: Severity = "high" if gain >= 6 else "medium" if gain >= 1 else "low"
    by_layer = any(c.layer_sqnr for c in bad)
    measure = "its consumer layer's local output SQNR" if by_layer else "the tensor's own quantization SQNR"
    switch = [c for c in bad if c.best != c.chosen and c.gain_db >= 1]
    entries = ", ".join(f"{c.tensor!r}: {c.best!r}" for c in switch[:3])
    more = "" if len(switch) <= 3 else f", ... ({len(switch) - 3} more in the evidence)"
    fix = (f"Pick the calibrator per tensor: CalibConfig(per_tensor={{{entries}{more}}})." if switch
           else "The calibrator in use is already the best (or within 1 dB) by " + measure + ".")
    finding = Finding(
        "calibrator_disagreement", severity, gain,
        f"Calibrators disagree by more than {ratio:g}x on {len(bad)} tensor(s); the best by {measure} "
        f"beats the one in use by up to {gain:.1f} dB", tuple(c.tensor for c in bad),
        Evidence(columns, rows), fix)
    return CheckOutcome((finding,), tuple(items))


# --------------------------------------------------------------------------------------------
# Calibration-set size (bootstrap)
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ScaleStability:
    """How one tensor's scale moves with the calibration samples.

    Attributes:
        tensor: ONNX value name.
        calibrator: The calibrator used for it.
        scale: Its scale with every sample.
        n_samples: Sample counts of the bootstrap levels, ascending (the last is every sample).
        median: Median bootstrap scale per level.
        lo: 10th-percentile scale per level.
        hi: 90th-percentile scale per level.
        spread: Half the 10-90 % band at the last level, relative to ``scale``.
        stable: ``spread`` is within the configured tolerance.
    """

    tensor: str
    calibrator: str
    scale: float
    n_samples: tuple[int, ...]
    median: tuple[float, ...]
    lo: tuple[float, ...]
    hi: tuple[float, ...]
    spread: float
    stable: bool

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in self.__dict__.items()}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ScaleStability:
        """Inverse of :meth:`to_dict`."""
        values = dict(data)
        for key in ("n_samples", "median", "lo", "hi"):
            values[key] = tuple(values[key])
        return cls(**values)


@dataclass(frozen=True)
class ChunkedStats:
    """Statistics collected per interleaved chunk of the samples (sample ``i`` in chunk ``i % K``).

    Attributes:
        chunks: Per chunk: tensor name -> statistics.
        sizes: Samples per chunk.
    """

    chunks: tuple[Mapping[str, TensorStats], ...]
    sizes: tuple[int, ...]


def collect_chunked(model: onnx.ModelProto, data: Iterable[Mapping[str, np.ndarray]], tensors: Sequence[str],
                    histogram: Collection[str], chunks: int, num_bins: int = 2048,
                    threads: int = 0) -> ChunkedStats:
    """One pass over ``data`` streaming each sample's activations into its chunk's collectors.

    Args:
        model: A loaded FP32 model.
        data: Feeds; rows of each input are samples.
        tensors: Activation tensors to collect.
        histogram: Tensors that need a histogram.
        chunks: Number of chunks ``K``.
        num_bins: Calibrator resolution of the histograms.
        threads: ONNX Runtime intra-op threads (0: all cores).

    Returns:
        The per-chunk statistics (histograms of one length, so chunks merge exactly).
    """
    from quantdbg.backends import OnnxrtRunner, OrtConfig
    from quantdbg.calibration import Collector, expose_tensors
    from quantdbg.model import input_specs

    specs = input_specs(model)
    fetch = [t for t in tensors if t not in specs]
    collectors = [Collector(tensors, set(histogram), num_bins) for _ in range(chunks)]
    sizes = [0] * chunks
    offset = 0
    with OnnxrtRunner(expose_tensors(model, fetch), OrtConfig(intra_op_num_threads=threads)) as runner:
        for feed in data:
            rows = int(np.shape(next(iter(feed.values())))[0])
            owner = (offset + np.arange(rows)) % chunks
            offset += rows
            for k in np.unique(owner):
                part = {name: np.asarray(a)[owner == k] for name, a in feed.items()}
                values = runner.infer(part, fetch) if fetch else {}
                values.update({t: part[t] for t in tensors if t in part})
                for name in tensors:
                    collectors[int(k)].update(name, values[name])
                sizes[int(k)] += int((owner == k).sum())
    return ChunkedStats(tuple(c.result() for c in collectors), tuple(sizes))


def _levels(chunks: int) -> list[int]:
    levels = [1]
    while levels[-1] * 2 < chunks:
        levels.append(levels[-1] * 2)
    return levels + [chunks] if levels[-1] != chunks else levels


def bootstrap_stability(chunked: ChunkedStats, calibrators: Mapping[str, Any], rounds: int = 16,
                        tolerance: float = 0.05, seed: int = 0) -> list[ScaleStability]:
    """Bootstraps chunks of samples (with replacement) and measures how each scale moves.

    At each level ``m`` (1, 2, 4, ... ``K`` chunks) ``rounds`` resamples of ``m`` chunks are merged
    exactly and calibrated, so the last level is the classic bootstrap of the whole set and the
    levels below show how the scale converges as samples are added.

    Args:
        chunked: Per-chunk statistics from :func:`collect_chunked`.
        calibrators: Tensor name -> calibrator instance.
        rounds: Resamples per level.
        tolerance: Largest relative half-width of the 10-90 % band still called stable.
        seed: Seed of the resampling.

    Returns:
        One entry per tensor, in ``calibrators`` order.
    """
    from quantdbg.calibration import merge_stats

    k = len(chunked.chunks)
    rng = np.random.default_rng(seed)
    levels = _levels(k)
    per_chunk = sum(chunked.sizes) / k
    draws = {m: [rng.integers(0, k, size=m) for _ in range(rounds)] for m in levels}
    found = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", QuantDbgWarning)
        for tensor, calibrator in calibrators.items():
            full = calibrator.compute(merge_stats(tensor, (c[tensor] for c in chunked.chunks))).scale
            bands = []
            for m in levels:
                merged = (merge_stats(tensor, (chunked.chunks[i][tensor] for i in idx)) for idx in draws[m])
                scales = [calibrator.compute(stats).scale for stats in merged]
                bands.append(np.percentile(scales, [50, 10, 90]))
            spread = float((bands[-1][2] - bands[-1][1]) / 2 / full) if full > 0 else 0.0
            found.append(ScaleStability(
                tensor, calibrator.name, float(full), tuple(int(round(m * per_chunk)) for m in levels),
                tuple(float(b[0]) for b in bands), tuple(float(b[1]) for b in bands),
                tuple(float(b[2]) for b in bands), spread, spread <= tolerance))
    return found


def check_calibration_size(items: Sequence[ScaleStability], n_samples: int) -> CheckOutcome:
    """Names the tensors whose scale is not yet stable (see :func:`bootstrap_stability`).

    Args:
        items: Bootstrap results.
        n_samples: Calibration samples used.

    Returns:
        One finding (medium when a scale moves by more than 10 %, else low) or none.
    """
    bad = sorted((s for s in items if not s.stable), key=lambda s: -s.spread)
    if not bad:
        return CheckOutcome((), tuple(items))
    worst = bad[0]
    rows = tuple((s.tensor, s.calibrator, s.scale, s.lo[-1], s.hi[-1], s.spread) for s in bad)
    finding = Finding(
        "calibration_size", "medium" if worst.spread > 0.10 else "low", worst.spread,
        f"{len(bad)} scale(s) are not yet stable with {n_samples} calibration samples: {worst.tensor}'s "
        f"scale moves by +-{100 * worst.spread:.1f}% across bootstrap resamples",
        tuple(s.tensor for s in bad),
        Evidence(("tensor", "calibrator", "scale", "scale p10", "scale p90", "+- (relative)"), rows),
        "Calibrate on more (representative) samples until these scales settle, or use a calibrator that "
        "depends less on the few largest values (percentile, mse or entropy instead of minmax).")
    return CheckOutcome((finding,), tuple(items))


# --------------------------------------------------------------------------------------------
# One tensor mixing value ranges
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class MixedRange:
    """Per-channel view of one tensor under a single per-tensor scale.

    Attributes:
        tensor: ONNX value name.
        role: ``"output"`` (a graph output) or ``"quantized"`` (an activation with a Q/DQ pair).
        axis: The channel axis examined.
        scale: The single scale (the calibrated one, or max|x| / 127 for an output).
        channel_absmax: max|x| per channel.
        channel_zeroed: Share of each channel's non-zero values that round to 0 with ``scale``.
        swamped: Channels carrying significant values whose max|x| is at most 1/16 of the largest
            channel's, and where more than the threshold of non-zero values round to 0.
        sqnr_db: SQNR of the whole tensor quantized with ``scale``.
        swamped_sqnr_db: SQNR of the swamped channels alone (nan when none).
    """

    tensor: str
    role: Literal["output", "quantized"]
    axis: int
    scale: float
    channel_absmax: tuple[float, ...]
    channel_zeroed: tuple[float, ...]
    swamped: tuple[int, ...]
    sqnr_db: float
    swamped_sqnr_db: float

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return {"tensor": self.tensor, "role": self.role, "axis": self.axis, "scale": self.scale,
                "channel_absmax": list(self.channel_absmax), "channel_zeroed": list(self.channel_zeroed),
                "swamped": list(self.swamped), "sqnr_db": encode_float(self.sqnr_db),
                "swamped_sqnr_db": encode_float(self.swamped_sqnr_db)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> MixedRange:
        """Inverse of :meth:`to_dict`."""
        return cls(data["tensor"], data["role"], int(data["axis"]), float(data["scale"]),
                   tuple(data["channel_absmax"]), tuple(data["channel_zeroed"]), tuple(data["swamped"]),
                   _from_json(data["sqnr_db"]), _from_json(data["swamped_sqnr_db"]))


@dataclass
class _ChannelSums:
    """Streaming per-channel sums for one (tensor, axis)."""

    scale: float
    absmax: np.ndarray | None = None
    count: np.ndarray | None = None
    nonzero: np.ndarray | None = None
    significant: np.ndarray | None = None
    zeroed: np.ndarray | None = None
    signal: np.ndarray | None = None
    noise: np.ndarray | None = None

    def update(self, x: np.ndarray, axis: int) -> None:
        moved = np.moveaxis(np.asarray(x, np.float64), axis, 0).reshape(x.shape[axis], -1)
        q = np.clip(np.round(moved / self.scale), -QMAX - 1, QMAX) * self.scale
        nz = moved != 0
        batch = {"absmax": np.abs(moved).max(axis=1), "count": np.full(moved.shape[0], moved.shape[1]),
                 "nonzero": nz.sum(axis=1),
                 "significant": (np.abs(moved) >= SIGNIFICANT * QMAX * self.scale).sum(axis=1),
                 "zeroed": (nz & (q == 0)).sum(axis=1), "signal": (moved ** 2).sum(axis=1),
                 "noise": ((moved - q) ** 2).sum(axis=1)}
        for name, value in batch.items():
            old = getattr(self, name)
            new = value if old is None else (np.maximum(old, value) if name == "absmax" else old + value)
            setattr(self, name, new)


def _candidate_axes(rank: int) -> list[int]:
    if rank < 2:
        return []
    return sorted({1, rank - 1})


def _mixed_entry(tensor: str, role: Literal["output", "quantized"], axis: int, sums: _ChannelSums,
                 threshold: float) -> MixedRange:
    assert sums.absmax is not None and sums.count is not None and sums.nonzero is not None
    assert sums.zeroed is not None and sums.signal is not None and sums.noise is not None
    assert sums.significant is not None
    zeroed = np.where(sums.nonzero > 0, sums.zeroed / np.maximum(sums.nonzero, 1), 0.0)
    alive = sums.significant >= MIN_ALIVE * sums.count
    small = sums.absmax <= sums.absmax.max(initial=0.0) / MIXED_RATIO
    swamped = np.flatnonzero((zeroed > threshold) & alive & small)
    swamped_sqnr = sqnr_db(float(sums.signal[swamped].sum()), float(sums.noise[swamped].sum())) \
        if swamped.size else math.nan
    return MixedRange(tensor, role, axis, sums.scale, tuple(float(v) for v in sums.absmax),
                      tuple(float(v) for v in zeroed), tuple(int(c) for c in swamped),
                      sqnr_db(float(sums.signal.sum()), float(sums.noise.sum())), swamped_sqnr)


def mixed_ranges(model: onnx.ModelProto, data: Iterable[Mapping[str, np.ndarray]],
                 scales: Mapping[str, float], outputs: Sequence[str], threshold: float = 0.5,
                 threads: int = 0) -> list[MixedRange]:
    """Measures, per channel, what one per-tensor scale does to each tensor.

    Args:
        model: A loaded FP32 model.
        data: Feeds (iterated twice when ``outputs`` need their max|x| first).
        scales: Quantized activation tensor -> its scale.
        outputs: Graph outputs to examine with the scale ``max|x| / 127``.
        threshold: Share of a channel's non-zero values rounding to 0 that makes it swamped.
        threads: ONNX Runtime intra-op threads.

    Returns:
        One entry per (tensor, channel axis) examined; for each tensor the axis with the most
        swamped channels comes first.
    """
    from quantdbg.backends import OnnxrtRunner, OrtConfig
    from quantdbg.calibration import collect_stats, expose_tensors
    from quantdbg.model import input_specs

    specs = input_specs(model)
    all_scales = dict(scales)
    pending = [o for o in outputs if o not in all_scales]
    if pending:
        stats = collect_stats(model, data, pending)
        all_scales.update({o: (stats[o].absmax or 1.0) / QMAX for o in pending})
    roles: dict[str, Literal["output", "quantized"]] = {t: "quantized" for t in scales}
    roles.update({o: "output" for o in outputs})
    sums: dict[tuple[str, int], _ChannelSums] = {}
    fetch = [t for t in roles if t not in specs]
    with OnnxrtRunner(expose_tensors(model, fetch), OrtConfig(intra_op_num_threads=threads)) as runner:
        for feed in data:
            values = runner.infer(feed, fetch) if fetch else {}
            values.update({t: np.asarray(feed[t]) for t in roles if t in feed})
            for tensor in roles:
                x = values[tensor]
                if not np.issubdtype(x.dtype, np.floating):
                    continue
                for axis in _candidate_axes(x.ndim):
                    sums.setdefault((tensor, axis), _ChannelSums(all_scales[tensor])).update(x, axis)
    found = [_mixed_entry(t, roles[t], axis, s, threshold) for (t, axis), s in sums.items()]
    return sorted(found, key=lambda m: (list(roles).index(m.tensor), -len(m.swamped), m.axis))


def check_mixed_ranges(items: Sequence[MixedRange], min_sqnr_db: float = 25.0) -> CheckOutcome:
    """Flags tensors where one scale zeroes whole channels while the tensor's SQNR looks fine.

    Args:
        items: Measurements from :func:`mixed_ranges`.
        min_sqnr_db: Whole-tensor SQNR at or above which the damage is hidden.

    Returns:
        One finding per affected tensor (high for a graph output, medium for a quantized tensor).
    """
    findings = []
    seen: set[str] = set()
    for item in items:
        if item.tensor in seen or not item.swamped or item.sqnr_db < min_sqnr_db:
            continue
        seen.add(item.tensor)
        big = max(item.channel_absmax)
        small = max(item.channel_absmax[c] for c in item.swamped)
        rows = tuple((c, item.channel_absmax[c], item.channel_zeroed[c]) for c in item.swamped[:16])
        where = "graph output" if item.role == "output" else "quantized tensor"
        findings.append(Finding(
            "mixed_ranges", "high" if item.role == "output" else "medium",
            float(len(item.swamped)) / max(len(item.channel_absmax), 1),
            f"{where} {item.tensor} mixes value ranges on axis {item.axis}: one scale ({item.scale:.3g}) "
            f"zeroes most values of {len(item.swamped)} of {len(item.channel_absmax)} channels (max |x| "
            f"{small:.3g} vs "
            f"{big:.3g}) while its SQNR is {item.sqnr_db:.1f} dB (those channels alone: "
            f"{item.swamped_sqnr_db:.1f} dB)", (item.tensor,),
            Evidence(("channel", "max |x|", "zeroed share"), rows),
            "Do not judge this tensor by SQNR: score the model with a task metric. Keep it out of INT8 "
            "(exclude its consumers) or split it so each value range gets its own scale."))
    return CheckOutcome(tuple(findings), tuple(items))


# --------------------------------------------------------------------------------------------
# Sensitive layers
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class LayerConfirmation:
    """A layer from the cheap ranking, measured alone (only its Q/DQ pairs active).

    Attributes:
        node: Node name.
        op_type: Its op type.
        local_rank: Its rank in the local ranking.
        local_sqnr_db: Its own output's SQNR in local mode.
        isolated_sqnr_db: Model output SQNR with only this layer in INT8.
        isolated_value: The task metric with only this layer in INT8.
        noise_share: Output noise power with only this layer in INT8 / with every layer in INT8.
    """

    node: str
    op_type: str
    local_rank: int
    local_sqnr_db: float
    isolated_sqnr_db: float
    isolated_value: float
    noise_share: float

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return {k: encode_float(v) if isinstance(v, float) else v for k, v in self.__dict__.items()}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LayerConfirmation:
        """Inverse of :meth:`to_dict`."""
        return cls(data["node"], data["op_type"], int(data["local_rank"]),
                   *(_from_json(data[k]) for k in
                     ("local_sqnr_db", "isolated_sqnr_db", "isolated_value", "noise_share")))


@dataclass(frozen=True)
class Confirmation:
    """The top of a cheap ranking, measured in isolation.

    Attributes:
        full_sqnr_db: Output SQNR of the fully quantized model.
        layers: One entry per confirmed layer, most harmful first.
        metric: The task metric in ``LayerConfirmation.isolated_value`` (``"sqnr"``: the output
            SQNR again).
        full_value: That metric for the fully quantized model.
    """

    full_sqnr_db: float
    layers: tuple[LayerConfirmation, ...]
    metric: str = "sqnr"
    full_value: float = math.nan

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return {"full_sqnr_db": encode_float(self.full_sqnr_db), "metric": self.metric,
                "full_value": encode_float(self.full_value), "layers": [c.to_dict() for c in self.layers]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Confirmation:
        """Inverse of :meth:`to_dict`."""
        return cls(_from_json(data["full_sqnr_db"]),
                   tuple(LayerConfirmation.from_dict(c) for c in data["layers"]), data.get("metric", "sqnr"),
                   _from_json(data.get("full_value", "nan")))


def confirm_layers(evaluator: Any, ranking: SensitivityReport, top: int) -> Confirmation:
    """Measures the top layers of a cheap ranking in isolation.

    Args:
        evaluator: A :class:`quantdbg.sensitivity.VariantEvaluator` on the evaluation data.
        ranking: The (local) ranking.
        top: How many layers to confirm.

    Returns:
        The fully quantized model's output SQNR and the confirmed layers, most harmful first.
    """
    full = evaluator.run(evaluator.layers)
    full_sqnr = full.comparison.total.sqnr_db if full.comparison is not None else math.nan
    found = []
    for layer in ranking.layers[:top]:
        result = evaluator.run((layer.node,))
        sqnr = result.comparison.total.sqnr_db if result.comparison is not None else math.nan
        share = nsr(sqnr) / nsr(full_sqnr) if nsr(full_sqnr) > 0 else math.nan
        found.append(LayerConfirmation(layer.node, layer.op_type, layer.rank, float(layer.value), float(sqnr),
                                       float(result.value), float(share)))
    found.sort(key=lambda c: (c.isolated_sqnr_db, c.local_rank))
    return Confirmation(float(full_sqnr), tuple(found), evaluator.metric.name, float(full.value))


def check_sensitive_layers(confirmation: Confirmation, max_sqnr_db: float = 30.0,
                           dominant_share: float = 0.5) -> CheckOutcome:
    """Names the layers that hurt the output on their own.

    A confirmed layer is named when, quantized alone, the output SQNR falls below
    ``max_sqnr_db`` or it causes at least ``dominant_share`` of the fully quantized model's
    output noise.

    Args:
        confirmation: Isolated measurements (see :func:`confirm_layers`).
        max_sqnr_db: Isolated output SQNR below which a layer is sensitive.
        dominant_share: Share of the full model's output noise that makes a layer the culprit.

    Returns:
        One finding (high below 20 dB isolated SQNR, medium below ``max_sqnr_db``, else low).
    """
    confirmed = confirmation.layers
    bad = [c for c in confirmed if c.isolated_sqnr_db < max_sqnr_db or c.noise_share >= dominant_share]
    if not bad:
        return CheckOutcome((), (confirmation,))
    worst = min(c.isolated_sqnr_db for c in bad)
    severity: Severity = "high" if worst < 20 else "medium" if worst < max_sqnr_db else "low"
    with_metric = confirmation.metric != "sqnr"  # else the metric repeats the SQNR column
    rows = tuple((c.node, c.op_type, c.local_rank, c.local_sqnr_db, c.isolated_sqnr_db, c.noise_share)
                 + ((c.isolated_value,) if with_metric else ()) for c in bad)
    names = ", ".join(c.node for c in bad)
    columns = ("node", "op", "local rank", "local SQNR (dB)", "isolated output SQNR (dB)",
               "share of INT8 noise") + ((f"isolated {confirmation.metric}",) if with_metric else ())
    finding = Finding(
        "sensitive_layers", severity, -worst,
        f"{len(bad)} layer(s) degrade the output on their own: {names} (fully INT8 output SQNR "
        f"{confirmation.full_sqnr_db:.1f} dB)", tuple(c.node for c in bad),
        Evidence(columns, rows),
        "Run `quantdbg fallback` to find the smallest set to keep in FP16 (these layers first), or try "
        "another calibrator for their inputs (see the calibrator finding and the ranking's evidence).")
    return CheckOutcome((finding,), (confirmation,))


# --------------------------------------------------------------------------------------------
# Q/DQ placements TensorRT cannot fuse (static lint)
# --------------------------------------------------------------------------------------------

_LINT_SEVERITY: Mapping[str, Severity] = MappingProxyType(
    {"error": "high", "warning": "medium", "info": "info"})


def check_qdq_fusion(model: onnx.ModelProto) -> CheckOutcome:
    """Runs the TensorRT Q/DQ lint (:func:`quantdbg.lint.lint`) and groups its findings by rule.

    Args:
        model: The Q/DQ model.

    Returns:
        One finding per lint rule that fired (lint errors high, warnings medium, info info); the
        data holds the :class:`~quantdbg.lint.LintReport`.
    """
    from quantdbg.diagnostics.linter import RULES, lint

    report = lint(model)
    by_rule: dict[str, list[Any]] = {}
    for item in report.findings:
        by_rule.setdefault(item.rule, []).append(item)
    findings = []
    for rule, items in by_rule.items():
        title = RULES[rule].title if rule in RULES else rule
        severity = _LINT_SEVERITY[items[0].severity.value]
        findings.append(Finding(
            "qdq_fusion", severity, float(len(items)),
            f"TensorRT lint `{rule}`: {title} ({len(items)} node(s))", tuple(i.node for i in items),
            Evidence(("node", "finding"), tuple((i.node, i.message) for i in items)), items[0].fix))
    return CheckOutcome(tuple(findings), (report,))
