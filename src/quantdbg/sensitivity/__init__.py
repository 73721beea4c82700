"""Sensitivity: which quantized layers hurt, ranked by node name, with the evidence of why.

``config`` (modes, SensitivityConfig) -> ``evaluator`` (variants of the Q/DQ model on one session of
the ``graphs``' switchable graph) -> ``modes`` (registry: ``local``, ``cumulative``, ``sweep`` for
isolated / leave-one-out, summed by ``reductions``; ``resume`` keeps a sweep's progress) ->
``evidence`` -> ``output_space`` (each layer alone in INT8, scored on the model's outputs; ``ranks``
fuses that ranking with the mode's and measures their agreement) -> ``measurement`` -> ``report``
(SensitivityReport); ``analyze`` runs them in that order, and ``suggest`` turns a report's evidence
into per-tensor calibrator choices.
"""
from quantdbg._exports import public_names as _public_names
from quantdbg.sensitivity.analyze import analyze_sensitivity
from quantdbg.sensitivity.config import (
    EVIDENCE_BATCHES,
    MODES,
    OUTPUT_SAMPLES,
    OUTPUT_SPACE_MODES,
    Mode,
    SensitivityConfig,
)
from quantdbg.sensitivity.evaluator import VariantEvaluator, VariantResult, default_runner_factory
from quantdbg.sensitivity.evidence import LayerEvidence
from quantdbg.sensitivity.modes import MODE_FUNCTIONS
from quantdbg.sensitivity.output_space import OutputSpace, measure_output_space
from quantdbg.sensitivity.ranks import (
    FUSION_K,
    TOP_K,
    RankAgreement,
    fuse_rankings,
    rank_agreement,
    rank_correlation,
)
from quantdbg.sensitivity.report import LayerSensitivity, QuantizedInput, SensitivityReport, TensorError
from quantdbg.sensitivity.resume import SweepProgress
from quantdbg.sensitivity.suggest import suggest_calibrators

__all__ = _public_names(globals())
