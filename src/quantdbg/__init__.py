"""quantdbg: INT8 post-training quantization of ONNX models for TensorRT, and its debugging.

The public API is re-exported here lazily, so ``import quantdbg`` stays cheap and never imports
an optional dependency.
"""
from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    # errors
    "QuantDbgError": "quantdbg.errors", "ModelError": "quantdbg.errors", "DataError": "quantdbg.errors",
    "ConfigError": "quantdbg.errors", "MissingDependencyError": "quantdbg.errors",
    "BackendError": "quantdbg.errors", "NotCalibratedError": "quantdbg.errors",
    "QuantDbgWarning": "quantdbg.errors",
    # configs and data
    "CalibConfig": "quantdbg.config", "QuantConfig": "quantdbg.config", "Precision": "quantdbg.config",
    "load_model": "quantdbg.model", "save_model": "quantdbg.model",
    "ArrayData": "quantdbg.data", "load_npz": "quantdbg.data",
    # Q/DQ placement, insertion, removal; the one-call path; the ONNX Runtime backend
    "quantize": "quantdbg.api",
    "calibrate": "quantdbg.calibrate", "CalibrationResult": "quantdbg.calibrate",
    "collect_stats": "quantdbg.stats", "TensorStats": "quantdbg.stats",
    "TensorRange": "quantdbg.calibrators.base", "register_calibrator": "quantdbg.calibrators",
    "get_calibrator": "quantdbg.calibrators", "available_calibrators": "quantdbg.calibrators",
    "write_trt_cache": "quantdbg.cache", "read_trt_cache": "quantdbg.cache",
    "write_scales_json": "quantdbg.cache", "read_scales_json": "quantdbg.cache",
    "lint": "quantdbg.lint", "LintReport": "quantdbg.lint",
    "diagnose": "quantdbg.doctor", "DoctorConfig": "quantdbg.doctor",
    "write_report": "quantdbg.report", "load_result": "quantdbg.report", "ReportBundle": "quantdbg.report",
    "load_embedded": "quantdbg.demo", "run_demo": "quantdbg.demo",
    "QuantTarget": "quantdbg.qdq", "QdqPlan": "quantdbg.qdq", "QdqRecord": "quantdbg.qdq",
    "QuantizedModel": "quantdbg.qdq", "plan_qdq": "quantdbg.qdq", "insert_qdq": "quantdbg.qdq",
    "remove_qdq": "quantdbg.qdq", "records_from_model": "quantdbg.qdq",
    "OnnxrtRunner": "quantdbg.backends.onnxrt", "OrtConfig": "quantdbg.backends.onnxrt",
    # sensitivity analysis and fallback search
    "analyze_sensitivity": "quantdbg.sensitivity", "SensitivityReport": "quantdbg.sensitivity",
    "search_fallback": "quantdbg.fallback", "auto_fallback": "quantdbg.fallback",
    "FallbackTarget": "quantdbg.fallback", "FallbackPlan": "quantdbg.fallback",
    "FallbackConfig": "quantdbg.fallback", "write_mixed_model": "quantdbg.fallback",
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'quantdbg' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])


__all__ = sorted(_EXPORTS)
