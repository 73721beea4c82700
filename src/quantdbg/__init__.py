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

# The documented API, by the package that owns each name; everything else is reachable through its
# package (quantdbg.calibration, quantdbg.placement, quantdbg.qdq, quantdbg.backends, ...).
_API: dict[str, tuple[str, ...]] = {
    "quantdbg.errors": ("QuantDbgError", "ModelError", "DataError", "ConfigError", "FormatError",
                        "MissingDependencyError", "BackendError", "OutputError", "NotCalibratedError",
                        "QuantDbgWarning"),
    "quantdbg.config": ("CalibConfig", "QuantConfig", "Precision"),
    "quantdbg.execution": ("LocalExecutor", "RayExecutor"),
    "quantdbg.model": ("load_model", "save_model"),
    "quantdbg.data": ("load_npz",),
    "quantdbg.placement": ("plan_qdq",),
    "quantdbg.calibration": ("calibrate", "CalibrationResult", "register_calibrator"),
    "quantdbg.qdq": ("quantize", "insert_qdq", "remove_qdq", "records_from_model", "QuantizedModel",
                     "write_trt_cache", "read_trt_cache"),
    "quantdbg.sensitivity": ("analyze_sensitivity", "SensitivityConfig", "SensitivityReport"),
    "quantdbg.diagnostics": ("lint", "LintReport", "diagnose", "DoctorConfig", "DoctorReport"),
    "quantdbg.fallback": ("auto_fallback", "search_fallback", "FallbackConfig", "FallbackTarget",
                          "FallbackPlan"),
    "quantdbg.pipeline": ("auto", "AutoConfig", "AutoResult"),
    "quantdbg.report": ("write_report", "load_result", "ReportBundle"),
    "quantdbg.demo": ("load_embedded", "run_demo"),
}
_EXPORTS = {name: module for module, names in _API.items() for name in names}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'quantdbg' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})


__all__ = sorted(_EXPORTS)
