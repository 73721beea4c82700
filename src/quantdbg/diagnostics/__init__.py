"""Diagnostics: the static Q/DQ lint for TensorRT and ``doctor``'s checks of the classic PTQ problems.

Both speak one language (:mod:`~quantdbg.diagnostics.findings`): a :class:`Finding` with a
:class:`Severity`, its :class:`Evidence` and a fix. The lint's rules are a registry
(:mod:`~quantdbg.diagnostics.lint_rules`) over a read-only graph view
(:mod:`~quantdbg.diagnostics.qdq_graph`); the doctor's checks are a registry of one module each
(:mod:`~quantdbg.diagnostics.checks`).
"""
from quantdbg._exports import public_names as _public_names
from quantdbg.diagnostics.checks.base import Check as Check
from quantdbg.diagnostics.checks.base import CheckContext as CheckContext
from quantdbg.diagnostics.checks.base import CheckOutcome as CheckOutcome
from quantdbg.diagnostics.checks.calibration_size import ChunkedStats as ChunkedStats
from quantdbg.diagnostics.checks.calibration_size import ScaleStability as ScaleStability
from quantdbg.diagnostics.checks.calibration_size import bootstrap_stability as bootstrap_stability
from quantdbg.diagnostics.checks.calibration_size import check_calibration_size as check_calibration_size
from quantdbg.diagnostics.checks.calibration_size import collect_chunked as collect_chunked
from quantdbg.diagnostics.checks.calibrator_disagreement import (
    check_calibrator_disagreement as check_calibrator_disagreement,
)
from quantdbg.diagnostics.checks.calibrator_disagreement import layer_sqnr as layer_sqnr
from quantdbg.diagnostics.checks.folded_weights import check_folded_weights as check_folded_weights
from quantdbg.diagnostics.checks.folded_weights import folded_evidence as folded_evidence
from quantdbg.diagnostics.checks.mixed_ranges import MixedRange as MixedRange
from quantdbg.diagnostics.checks.mixed_ranges import check_mixed_ranges as check_mixed_ranges
from quantdbg.diagnostics.checks.mixed_ranges import mixed_ranges as mixed_ranges
from quantdbg.diagnostics.checks.qdq_fusion import check_qdq_fusion as check_qdq_fusion
from quantdbg.diagnostics.checks.registry import CHECK_REGISTRY as CHECK_REGISTRY
from quantdbg.diagnostics.checks.sensitive_layers import Confirmation as Confirmation
from quantdbg.diagnostics.checks.sensitive_layers import LayerConfirmation as LayerConfirmation
from quantdbg.diagnostics.checks.sensitive_layers import check_sensitive_layers as check_sensitive_layers
from quantdbg.diagnostics.checks.sensitive_layers import confirm_layers as confirm_layers
from quantdbg.diagnostics.checks.weight_zeroing import WeightZeroing as WeightZeroing
from quantdbg.diagnostics.checks.weight_zeroing import check_weight_zeroing as check_weight_zeroing
from quantdbg.diagnostics.checks.weight_zeroing import weight_zeroing as weight_zeroing
from quantdbg.diagnostics.checks.weight_zeroing import zeroing_evidence as zeroing_evidence
from quantdbg.diagnostics.doctor import CheckRun as CheckRun
from quantdbg.diagnostics.doctor import DoctorReport as DoctorReport
from quantdbg.diagnostics.doctor import RunStatus as RunStatus
from quantdbg.diagnostics.doctor import diagnose as diagnose
from quantdbg.diagnostics.doctor import format_text as format_text
from quantdbg.diagnostics.doctor import sort_findings as sort_findings
from quantdbg.diagnostics.doctor_config import CHECKS as CHECKS
from quantdbg.diagnostics.doctor_config import CheckName as CheckName
from quantdbg.diagnostics.doctor_config import DoctorConfig as DoctorConfig
from quantdbg.diagnostics.findings import FAIL_ON as FAIL_ON
from quantdbg.diagnostics.findings import FAIL_ON_SHOWN as FAIL_ON_SHOWN
from quantdbg.diagnostics.findings import NO_EVIDENCE as NO_EVIDENCE
from quantdbg.diagnostics.findings import Cell as Cell
from quantdbg.diagnostics.findings import Evidence as Evidence
from quantdbg.diagnostics.findings import Finding as Finding
from quantdbg.diagnostics.findings import Severity as Severity
from quantdbg.diagnostics.findings import fail_threshold as fail_threshold
from quantdbg.diagnostics.findings import format_cell as format_cell
from quantdbg.diagnostics.findings import markdown_cell as markdown_cell
from quantdbg.diagnostics.findings import reaches as reaches
from quantdbg.diagnostics.findings import severity_counts as severity_counts
from quantdbg.diagnostics.lint_rules import ALIGNMENT as ALIGNMENT
from quantdbg.diagnostics.lint_rules import FLOAT_ONLY_OPS as FLOAT_ONLY_OPS
from quantdbg.diagnostics.lint_rules import INT8_CAPABLE_OPS as INT8_CAPABLE_OPS
from quantdbg.diagnostics.lint_rules import RULES as RULES
from quantdbg.diagnostics.lint_rules import Rule as Rule
from quantdbg.diagnostics.linter import LINT_SEVERITIES as LINT_SEVERITIES
from quantdbg.diagnostics.linter import LintReport as LintReport
from quantdbg.diagnostics.linter import lint as lint
from quantdbg.diagnostics.qdq_graph import CLIP_TOLERANCE as CLIP_TOLERANCE
from quantdbg.diagnostics.qdq_graph import WeightQuantization as WeightQuantization
from quantdbg.diagnostics.qdq_graph import weight_quantization as weight_quantization
from quantdbg.model import WEIGHTED_OPS as WEIGHTED_OPS

__all__ = _public_names(globals())
