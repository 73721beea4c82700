"""quantdbg: INT8 post-training quantization of ONNX models for TensorRT, and its debugging.

The public API is re-exported here lazily, so ``import quantdbg`` stays cheap and never imports
an optional dependency.
"""
from __future__ import annotations

import importlib
from typing import Any

from quantdbg import _display
from quantdbg._version import __version__ as __version__

# Results render in notebooks through the display hook; the report package fills it when first asked.
_display.add_provider("quantdbg.report.display")

_EXPORTS = {
    # errors
    "QuantDbgError": "quantdbg.errors", "ModelError": "quantdbg.errors", "DataError": "quantdbg.errors",
    "ConfigError": "quantdbg.errors", "FormatError": "quantdbg.errors",
    "MissingDependencyError": "quantdbg.errors", "BackendError": "quantdbg.errors",
    "NotCalibratedError": "quantdbg.errors", "QuantDbgWarning": "quantdbg.errors",
    # configs and data
    "CalibConfig": "quantdbg.config", "QuantConfig": "quantdbg.config", "Precision": "quantdbg.config",
    "load_model": "quantdbg.model", "save_model": "quantdbg.model",
    "ArrayData": "quantdbg.data", "load_npz": "quantdbg.data",
    # calibration
    "calibrate": "quantdbg.calibration.ranges", "CalibrationResult": "quantdbg.calibration.ranges",
    "collect_stats": "quantdbg.calibration.collect", "TensorStats": "quantdbg.calibration.stats",
    "TensorRange": "quantdbg.calibration.calibrators.base",
    "register_calibrator": "quantdbg.calibration.calibrators.base",
    "get_calibrator": "quantdbg.calibration.calibrators.base",
    "available_calibrators": "quantdbg.calibration.calibrators.base",
    # Q/DQ placement, insertion, removal; the one-call path; caches
    "QuantTarget": "quantdbg.placement.plan", "QdqPlan": "quantdbg.placement.plan",
    "plan_qdq": "quantdbg.placement.plan",
    "QdqRecord": "quantdbg.qdq.records", "QuantizedModel": "quantdbg.qdq.records",
    "insert_qdq": "quantdbg.qdq.insert", "remove_qdq": "quantdbg.qdq.remove",
    "records_from_model": "quantdbg.qdq.foreign", "quantize": "quantdbg.qdq.quantizer",
    "write_trt_cache": "quantdbg.qdq.cache", "read_trt_cache": "quantdbg.qdq.cache",
    "write_scales_json": "quantdbg.qdq.cache", "read_scales_json": "quantdbg.qdq.cache",
    # the ONNX Runtime backend
    "OnnxrtRunner": "quantdbg.backends.onnxrt", "OrtConfig": "quantdbg.backends.onnxrt",
    # sensitivity analysis and fallback search
    "analyze_sensitivity": "quantdbg.sensitivity",
    "SensitivityReport": "quantdbg.sensitivity",
    "search_fallback": "quantdbg.fallback", "auto_fallback": "quantdbg.fallback",
    "FallbackTarget": "quantdbg.fallback", "FallbackPlan": "quantdbg.fallback",
    "FallbackConfig": "quantdbg.fallback", "write_mixed_model": "quantdbg.fallback",
    # diagnostics and reports
    "lint": "quantdbg.diagnostics.linter", "LintReport": "quantdbg.diagnostics.linter",
    "diagnose": "quantdbg.diagnostics.doctor", "DoctorConfig": "quantdbg.diagnostics.doctor_config",
    "write_report": "quantdbg.report.render", "load_result": "quantdbg.report.results",
    "ReportBundle": "quantdbg.report.results",
    "load_embedded": "quantdbg.demo", "run_demo": "quantdbg.demo",
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'quantdbg' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])


__all__ = sorted(_EXPORTS)
