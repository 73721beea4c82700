"""TensorRT backend: a strongly typed engine from the Q/DQ model, its runner and inspector, and the
trtexec / Polygraphy commands that build the same engine. ``tensorrt`` itself loads on first use."""
from quantdbg.backends.tensorrt.commands import (
    BuildCommands,
    EngineBuildSpec,
    build_commands,
    polygraphy_convert_command,
    polygraphy_run_command,
    trtexec_command,
)
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

__all__ = ["BuildCommands", "EngineBuildSpec", "LatencyResult", "LayerPrecision", "ShapeRange", "TrtConfig",
           "TrtRunner", "build_commands", "build_engine", "parse_engine_info", "polygraphy_convert_command",
           "polygraphy_run_command", "precision_counts", "resolve_profile", "trtexec_command",
           "type_of_format", "unavailable_reason"]
