"""Sensitivity: which quantized layers hurt, ranked by node name, with the evidence of why."""
from quantdbg.sensitivity.analyze import (
    MODES,
    LayerSensitivity,
    SensitivityReport,
    VariantEvaluator,
    analyze_sensitivity,
    suggest_calibrators,
)

__all__ = ["MODES", "LayerSensitivity", "SensitivityReport", "VariantEvaluator", "analyze_sensitivity",
           "suggest_calibrators"]
