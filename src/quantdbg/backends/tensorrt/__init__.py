"""TensorRT backend: a strongly typed engine from the Q/DQ model, its runner and inspector, and the
trtexec / Polygraphy commands that build the same engine. ``tensorrt`` itself loads on first use.

Modules, in the order data flows: ``config`` (TrtConfig, ShapeRange, the optimization profile),
``bindings`` (TensorRT and cuda-python, loaded lazily), ``build`` (ONNX parser, builder config, timing
cache -> serialized engine), ``inspector`` (engine inspector JSON -> per-layer precision), ``runner``
(TrtRunner, device buffers, latency) and ``commands`` (the same build as trtexec / Polygraphy commands).
"""
from quantdbg._exports import public_names as _public_names
from quantdbg.backends.tensorrt.bindings import unavailable_reason
from quantdbg.backends.tensorrt.build import build_engine
from quantdbg.backends.tensorrt.commands import (
    BuildCommands,
    EngineBuildSpec,
    build_commands,
    polygraphy_convert_command,
    polygraphy_run_command,
    trtexec_command,
)
from quantdbg.backends.tensorrt.config import ShapeRange, TrtConfig, resolve_profile
from quantdbg.backends.tensorrt.inspector import (
    LayerPrecision,
    parse_engine_info,
    precision_counts,
    type_of_format,
)
from quantdbg.backends.tensorrt.runner import LatencyResult, TrtRunner

__all__ = _public_names(globals())
