"""Calibration-set size: how much each scale still moves when the calibration samples are resampled.

The samples are split into interleaved chunks (sample ``i`` in chunk ``i % K``), collected in one
pass; bootstrap resamples of the chunks are merged exactly and calibrated again.
"""
from __future__ import annotations

import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import onnx

from quantdbg._json import Serializable
from quantdbg.backends import OnnxrtRunner, OrtConfig
from quantdbg.calibration import Calibrator, TensorStats
from quantdbg.calibration.calibrators.base import get_calibrator
from quantdbg.calibration.collect import expose_tensors
from quantdbg.calibration.stats import Collector, merge_stats
from quantdbg.data import SampleFeed, samples_in
from quantdbg.diagnostics.checks.base import Check, CheckContext, CheckOutcome
from quantdbg.diagnostics.findings import Evidence, Finding, Severity
from quantdbg.errors import QuantDbgWarning
from quantdbg.model.specs import input_specs
from quantdbg.placement import plan_qdq

MEDIUM_SPREAD = 0.10
"""Relative scale spread from which the finding is medium (below: low)."""


@dataclass(frozen=True)
class ScaleStability(Serializable):
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


@dataclass(frozen=True)
class ChunkedStats:
    """Statistics collected per interleaved chunk of the samples (sample ``i`` in chunk ``i % K``).

    Attributes:
        chunks: Per chunk: tensor name -> statistics.
        sizes: Samples per chunk.
    """

    chunks: tuple[Mapping[str, TensorStats], ...]
    sizes: tuple[int, ...]


def collect_chunked(model: onnx.ModelProto, data: Iterable[Mapping[str, np.ndarray]],
                    calibrators: Mapping[str, Calibrator], chunks: int, num_bins: int = 2048,
                    threads: int = 0) -> ChunkedStats:
    """One pass over ``data`` streaming each sample's activations into its chunk's collectors.

    Args:
        model: A loaded FP32 model.
        data: Feeds; rows of each input are samples.
        calibrators: Activation tensor -> the calibrator it is calibrated with (a histogram is
            collected for the tensors whose calibrator needs one).
        chunks: Number of chunks ``K``.
        num_bins: Calibrator resolution of the histograms.
        threads: ONNX Runtime intra-op threads (0: all cores).

    Returns:
        The per-chunk statistics (histograms of one length, so chunks merge exactly).
    """
    tensors = list(calibrators)
    histogram = {t for t, c in calibrators.items() if c.needs_histogram}
    specs = input_specs(model)
    fetch = [t for t in tensors if t not in specs]
    # A feed the model takes only whole (one sample of unbatched inputs, or a fixed batch) goes to
    # one chunk; other feeds are split by sample.
    whole = any(spec.fixed_batch for spec in specs.values())
    collectors = [Collector(tensors, histogram, num_bins) for _ in range(chunks)]
    sizes = [0] * chunks
    offset = 0
    with OnnxrtRunner(expose_tensors(model, fetch), OrtConfig(intra_op_num_threads=threads)) as runner:
        for index, feed in enumerate(data):
            rows = samples_in(feed)
            split = not (whole or isinstance(feed, SampleFeed))
            owner = (offset + np.arange(rows)) % chunks if split else np.full(rows, index % chunks)
            offset += rows
            for k in np.unique(owner):
                part = {name: np.asarray(a)[owner == k] for name, a in feed.items()} if split else feed
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


def _stability(chunked: ChunkedStats, tensor: str, calibrator: Calibrator,
               draws: Mapping[int, Sequence[np.ndarray]], tolerance: float) -> ScaleStability:
    """One tensor's scale with every chunk and its 10/50/90 % band at each resampling level."""
    full = calibrator.compute(merge_stats(tensor, (c[tensor] for c in chunked.chunks))).scale
    bands = []
    for indices in draws.values():
        merged = (merge_stats(tensor, (chunked.chunks[i][tensor] for i in idx)) for idx in indices)
        bands.append(np.percentile([calibrator.compute(stats).scale for stats in merged], [50, 10, 90]))
    spread = float((bands[-1][2] - bands[-1][1]) / 2 / full) if full > 0 else 0.0
    per_chunk = sum(chunked.sizes) / len(chunked.chunks)
    return ScaleStability(
        tensor, calibrator.name, float(full), tuple(int(round(m * per_chunk)) for m in draws),
        tuple(float(b[0]) for b in bands), tuple(float(b[1]) for b in bands),
        tuple(float(b[2]) for b in bands), spread, spread <= tolerance)


def bootstrap_stability(chunked: ChunkedStats, calibrators: Mapping[str, Calibrator], rounds: int = 16,
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
    k = len(chunked.chunks)
    rng = np.random.default_rng(seed)
    draws = {m: [rng.integers(0, k, size=m) for _ in range(rounds)] for m in _levels(k)}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", QuantDbgWarning)
        return [_stability(chunked, tensor, calibrator, draws, tolerance)
                for tensor, calibrator in calibrators.items()]


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
        "calibration_size", Severity.MEDIUM if worst.spread > MEDIUM_SPREAD else Severity.LOW, worst.spread,
        f"{len(bad)} scale(s) are not yet stable with {n_samples} calibration samples: {worst.tensor}'s "
        f"scale moves by +-{100 * worst.spread:.1f}% across bootstrap resamples",
        tuple(s.tensor for s in bad),
        Evidence(("tensor", "calibrator", "scale", "scale p10", "scale p90", "+- (relative)"), rows),
        "Calibrate on more (representative) samples until these scales settle, or use a calibrator that "
        "depends less on the few largest values (percentile, mse or entropy instead of minmax).")
    return CheckOutcome((finding,), tuple(items))


def run(ctx: CheckContext) -> CheckOutcome:
    """The doctor's run: every planned activation tensor with the calibrator the configuration gives it."""
    plan = plan_qdq(ctx.fp_model, ctx.config.quant)
    calibrators = {t: get_calibrator(ctx.config.calib.method_for(t, plan.consumer_ops(t)))
                   for t in plan.activation_tensors}
    config = ctx.config
    chunked = collect_chunked(ctx.fp_model, ctx.calib, calibrators, config.bootstrap_chunks,
                              config.calib.num_bins, config.threads)
    items = bootstrap_stability(chunked, calibrators, config.bootstrap_rounds, config.stable_spread,
                                config.seed)
    return check_calibration_size(items, sum(chunked.sizes))


CHECK = Check("calibration_size", run)
