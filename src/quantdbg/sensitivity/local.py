"""The ``local`` mode: each layer's own output error, fed FP32 inputs through its Q/DQ pairs.

One pass of the local graph (the FP32 model plus a quantized clone per layer) gives every layer's
error; no activation leaves the session.
"""
from __future__ import annotations

import math

from quantdbg._journal import Journal
from quantdbg.sensitivity.config import SensitivityConfig
from quantdbg.sensitivity.graphs import LocalVariant
from quantdbg.sensitivity.measurement import Measurement
from quantdbg.sensitivity.reductions import DataPass, run_local_graph
from quantdbg.variants.evaluator import VariantEvaluator


def measure_local(evaluator: VariantEvaluator, config: SensitivityConfig, journal: Journal) -> Measurement:
    """Scores each layer by minus the SQNR (dB) of its clone's output (``journal`` is not used).

    Args:
        evaluator: The models and data.
        config: The analysis settings (``progress``).
        journal: The journal (one pass needs no resuming).

    Returns:
        The measurement.
    """
    variants = [LocalVariant(layer, "recorded", {}) for layer in evaluator.layers]
    found = run_local_graph(evaluator, variants, DataPass("sensitivity (local)", config.progress))
    metrics = {variants[i].layer: m for i, m in found.items()}
    value = {n: metrics[n].sqnr_db if n in metrics else math.nan for n in evaluator.layers}
    return Measurement({n: -v for n, v in value.items()}, value, dict(metrics), metric_name="local sqnr (dB)")


__all__ = ["measure_local"]
