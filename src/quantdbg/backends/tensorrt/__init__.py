"""TensorRT backend: a strongly typed engine from the Q/DQ model, its runner and inspector, and the
trtexec / Polygraphy commands that build the same engine. ``tensorrt`` itself loads on first use."""
from quantdbg.backends.tensorrt.runner import (
    LatencyResult,
    LayerPrecision,
    ShapeRange,
    TrtConfig,
    TrtRunner,
    build_engine,
    parse_engine_info,
    precision_counts,
    resolve_profile,
    type_of_format,
    unavailable_reason,
)

__all__ = ["LatencyResult", "LayerPrecision", "ShapeRange", "TrtConfig", "TrtRunner", "build_engine",
           "parse_engine_info", "precision_counts", "resolve_profile", "type_of_format", "unavailable_reason"]
