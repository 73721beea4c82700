"""TensorRT backend: a strongly typed engine from the Q/DQ model, its runner and inspector, and the
trtexec / Polygraphy commands that build the same engine. ``tensorrt`` itself loads on first use.

Modules, in the order data flows: ``config`` (TrtConfig, ShapeRange, the optimization profile),
``bindings`` (TensorRT and cuda-python, loaded lazily), ``build`` (ONNX parser, builder config, timing
cache -> serialized engine), ``inspector`` (engine inspector JSON -> per-layer precision), ``runner``
(TrtRunner, device buffers, latency) and ``commands`` (the same build as trtexec / Polygraphy commands).
"""
from quantdbg.backends.tensorrt.bindings import unavailable_reason
from quantdbg.backends.tensorrt.build import build_engine
from quantdbg.backends.tensorrt.commands import BuildCommands, EngineBuildSpec, build_commands
from quantdbg.backends.tensorrt.config import ShapeRange, TrtConfig
from quantdbg.backends.tensorrt.inspector import LayerPrecision, parse_engine_info
from quantdbg.backends.tensorrt.runner import LatencyResult, TrtRunner

__all__ = [
    "BuildCommands", "EngineBuildSpec", "LatencyResult", "LayerPrecision", "ShapeRange", "TrtConfig",
    "TrtRunner", "build_commands", "build_engine", "parse_engine_info", "unavailable_reason",
]
