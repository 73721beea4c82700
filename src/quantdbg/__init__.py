"""quantdbg: INT8 post-training quantization of ONNX models for TensorRT, and its debugging.

The public API is re-exported here lazily, so ``import quantdbg`` stays cheap and never imports
an optional dependency. The step-by-step pieces are in their packages (``quantdbg.calibration``,
``quantdbg.placement``, ``quantdbg.qdq``, ``quantdbg.backends``, ...), each with its own ``__all__``.
"""
from typing import Any as _Any

from quantdbg import _display
from quantdbg._version import __version__ as __version__

__all__ = [
    "AutoConfig", "AutoResult", "BackendError", "CalibConfig", "CalibrationResult", "ConfigError",
    "DataError", "DoctorConfig", "DoctorReport", "FallbackConfig", "FallbackPlan", "FallbackTarget",
    "FormatError", "LintReport", "LocalExecutor", "MissingDependencyError", "ModelError",
    "NotCalibratedError", "OutputError", "Precision", "QuantConfig", "QuantDbgError", "QuantDbgWarning",
    "QuantizedModel", "RayExecutor", "ReportBundle", "SensitivityConfig", "SensitivityReport",
    "analyze_sensitivity", "auto", "auto_fallback", "calibrate", "diagnose", "insert_qdq", "lint",
    "load_embedded", "load_model", "load_npz", "load_result", "plan_qdq", "quantize", "read_trt_cache",
    "records_from_model", "register_calibrator", "remove_qdq", "run_demo", "save_model", "search_fallback",
    "write_report", "write_trt_cache",
]

# The package that owns each name of __all__, imported on first use.
_HOMES: dict[str, tuple[str, ...]] = {
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

# Results render in notebooks through the display hook; the report package fills it when first asked.
_display.add_provider("quantdbg.report.display")


def __getattr__(name: str) -> _Any:
    home = next((module for module, names in _HOMES.items() if name in names), None)
    if home is None:
        raise AttributeError(f"module 'quantdbg' has no attribute {name!r}")
    from importlib import import_module

    return getattr(import_module(home), name)


def __dir__() -> list[str]:
    return sorted([*__all__, "__version__"])
