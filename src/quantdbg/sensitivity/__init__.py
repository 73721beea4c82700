"""Sensitivity: which quantized layers hurt, ranked by node name, with the evidence of why."""
from quantdbg.sensitivity.analyze import (
    MODES,
    LayerSensitivity,
    Mode,
    SensitivityReport,
    VariantEvaluator,
    VariantResult,
    analyze_sensitivity,
    default_runner_factory,
    suggest_calibrators,
)
from quantdbg.sensitivity.evidence import LayerEvidence

__all__ = ["MODES", "LayerEvidence", "LayerSensitivity", "Mode", "SensitivityReport", "VariantEvaluator",
           "VariantResult", "analyze_sensitivity", "default_runner_factory", "suggest_calibrators"]
