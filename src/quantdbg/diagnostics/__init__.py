"""Diagnostics: the static Q/DQ lint for TensorRT and ``doctor``'s checks of the classic PTQ problems.

Both speak one language (:mod:`~quantdbg.diagnostics.findings`): a :class:`Finding` with a
:class:`Severity`, its :class:`Evidence` and a fix. The lint's rules are a registry
(:mod:`~quantdbg.diagnostics.lint_rules`) over a read-only graph view
(:mod:`~quantdbg.diagnostics.qdq_graph`); the doctor's checks are a registry of one module each
(:mod:`~quantdbg.diagnostics.checks`).
"""
from quantdbg._exports import public_names as _public_names
from quantdbg.diagnostics.checks.base import Check, CheckContext, CheckOutcome
from quantdbg.diagnostics.checks.calibration_size import (
    ChunkedStats,
    ScaleStability,
    bootstrap_stability,
    check_calibration_size,
    collect_chunked,
)
from quantdbg.diagnostics.checks.calibrator_disagreement import check_calibrator_disagreement, layer_sqnr
from quantdbg.diagnostics.checks.folded_weights import check_folded_weights, folded_evidence
from quantdbg.diagnostics.checks.mixed_ranges import MixedRange, check_mixed_ranges, mixed_ranges
from quantdbg.diagnostics.checks.qdq_fusion import check_qdq_fusion
from quantdbg.diagnostics.checks.registry import CHECK_REGISTRY
from quantdbg.diagnostics.checks.sensitive_layers import (
    Confirmation,
    LayerConfirmation,
    check_sensitive_layers,
    confirm_layers,
)
from quantdbg.diagnostics.checks.weight_zeroing import (
    WeightZeroing,
    check_weight_zeroing,
    weight_zeroing,
    zeroing_evidence,
)
from quantdbg.diagnostics.doctor import (
    CheckRun,
    DoctorReport,
    RunStatus,
    diagnose,
    format_text,
    sort_findings,
)
from quantdbg.diagnostics.doctor_config import CHECKS, CheckName, DoctorConfig
from quantdbg.diagnostics.findings import (
    FAIL_ON,
    NO_EVIDENCE,
    Cell,
    Evidence,
    Finding,
    Severity,
    fail_threshold,
    format_cell,
    markdown_cell,
    reaches,
    severity_counts,
)
from quantdbg.diagnostics.lint_rules import ALIGNMENT, FLOAT_ONLY_OPS, INT8_CAPABLE_OPS, RULES, Rule
from quantdbg.diagnostics.linter import LINT_SEVERITIES, LintReport, lint
from quantdbg.diagnostics.qdq_graph import CLIP_TOLERANCE, WeightQuantization, weight_quantization
from quantdbg.model import WEIGHTED_OPS

__all__ = _public_names(globals())
