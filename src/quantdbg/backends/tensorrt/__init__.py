"""TensorRT backend: a strongly typed engine from the Q/DQ model, its runner and inspector, and the
trtexec / Polygraphy commands that build the same engine. ``tensorrt`` itself loads on first use.

Modules, in the order data flows: ``config`` (TrtConfig, ShapeRange, the optimization profile),
``bindings`` (TensorRT and cuda-python, loaded lazily), ``build`` (ONNX parser, builder config, timing
cache -> serialized engine), ``inspector`` (engine inspector JSON -> per-layer precision), ``runner``
(TrtRunner, device buffers, latency) and ``commands`` (the same build as trtexec / Polygraphy commands).
"""
from quantdbg._exports import public_names as _public_names
from quantdbg.backends.tensorrt.bindings import unavailable_reason as unavailable_reason
from quantdbg.backends.tensorrt.build import build_engine as build_engine
from quantdbg.backends.tensorrt.commands import BuildCommands as BuildCommands
from quantdbg.backends.tensorrt.commands import EngineBuildSpec as EngineBuildSpec
from quantdbg.backends.tensorrt.commands import as_comment as as_comment
from quantdbg.backends.tensorrt.commands import build_commands as build_commands
from quantdbg.backends.tensorrt.commands import data_extents as data_extents
from quantdbg.backends.tensorrt.commands import layer_precisions_problem as layer_precisions_problem
from quantdbg.backends.tensorrt.commands import modelopt_command as modelopt_command
from quantdbg.backends.tensorrt.commands import polygraphy_convert_command as polygraphy_convert_command
from quantdbg.backends.tensorrt.commands import polygraphy_run_command as polygraphy_run_command
from quantdbg.backends.tensorrt.commands import trtexec_command as trtexec_command
from quantdbg.backends.tensorrt.config import ShapeRange as ShapeRange
from quantdbg.backends.tensorrt.config import TrtConfig as TrtConfig
from quantdbg.backends.tensorrt.config import batch_profile as batch_profile
from quantdbg.backends.tensorrt.config import resolve_profile as resolve_profile
from quantdbg.backends.tensorrt.inspector import LayerPrecision as LayerPrecision
from quantdbg.backends.tensorrt.inspector import parse_engine_info as parse_engine_info
from quantdbg.backends.tensorrt.inspector import precision_counts as precision_counts
from quantdbg.backends.tensorrt.inspector import type_of_format as type_of_format
from quantdbg.backends.tensorrt.runner import LatencyResult as LatencyResult
from quantdbg.backends.tensorrt.runner import TrtRunner as TrtRunner

__all__ = _public_names(globals())
