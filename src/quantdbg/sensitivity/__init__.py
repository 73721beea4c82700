"""Sensitivity: which quantized layers hurt, ranked by node name, with the evidence of why.

``config`` (modes, SensitivityConfig) -> ``evaluator`` (variants of the Q/DQ model on one session of
the ``graphs``' switchable graph; ``journaled`` keeps its evaluations in the run's journal) ->
``modes`` (registry: ``local``, ``cumulative``, ``sweep`` for isolated / leave-one-out, summed by
``reductions``) -> ``evidence`` -> ``output_space`` (each layer alone in INT8, scored on the model's
outputs; ``ranks`` fuses that ranking with the mode's and measures their agreement) ->
``measurement`` -> ``report`` (SensitivityReport); ``analyze`` runs them in that order, and
``suggest`` turns a report's evidence into per-tensor calibrator choices.
"""
from quantdbg.sensitivity.analyze import analyze_sensitivity
from quantdbg.sensitivity.config import SensitivityConfig
from quantdbg.sensitivity.evaluator import VariantEvaluator
from quantdbg.sensitivity.evidence import LayerEvidence
from quantdbg.sensitivity.report import LayerSensitivity, SensitivityReport
from quantdbg.sensitivity.suggest import suggest_calibrators

__all__ = [
    "LayerEvidence", "LayerSensitivity", "SensitivityConfig", "SensitivityReport", "VariantEvaluator",
    "analyze_sensitivity", "suggest_calibrators",
]
