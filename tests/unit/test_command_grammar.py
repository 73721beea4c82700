"""The emitted trtexec / Polygraphy / ModelOpt command lines parse under each tool's documented flags.

The parsers below mirror the flags as the tools document them (trtexec ``--help`` of TensorRT 10,
``polygraphy convert``/``run`` of Polygraphy 0.49, ``python -m modelopt.onnx.quantization``): a flag
that a tool does not know, a missing value or a malformed shape spec fails the parse, so each test
checks the command a user would paste, not a string compared with itself.
"""
from __future__ import annotations

import argparse
import json
import re
import shlex
from pathlib import Path

import models_lint
import onnx
import pytest

from quantdbg.backends.tensorrt import EngineBuildSpec, ShapeRange, build_commands, modelopt_command
from quantdbg.fallback import FallbackTarget, search_fallback


class _Refused(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # raise instead of exiting, so the test names the flag
        raise _Refused(message)


def _trtexec() -> _Parser:
    # trtexec takes every option as --name=value (or a bare switch).
    p = _Parser(prog="trtexec", prefix_chars="-", allow_abbrev=False)
    p.add_argument("--onnx", required=True)
    for switch in ("--stronglyTyped", "--int8", "--fp16", "--noTF32", "--best"):
        p.add_argument(switch, action="store_true")
    for name in ("--minShapes", "--optShapes", "--maxShapes", "--saveEngine", "--timingCacheFile",
                 "--memPoolSize", "--builderOptimizationLevel", "--profilingVerbosity", "--exportLayerInfo",
                 "--precisionConstraints", "--layerPrecisions"):
        p.add_argument(name)
    return p


def _polygraphy(subcommand: str) -> _Parser:
    p = _Parser(prog=f"polygraphy {subcommand}", allow_abbrev=False)
    p.add_argument("model_file")
    if subcommand == "convert":
        p.add_argument("--convert-to", choices=("onnx", "trt", "onnx-like-trt-network"))
        p.add_argument("-o", "--output", required=True)
    else:
        p.add_argument("--trt", action="store_true")
        p.add_argument("--onnxrt", action="store_true")
        p.add_argument("--input-shapes", nargs="+")
    for switch in ("--strongly-typed", "--tf32", "--fp16", "--int8"):
        p.add_argument(switch, action="store_true")
    for name in ("--trt-min-shapes", "--trt-opt-shapes", "--trt-max-shapes"):
        p.add_argument(name, nargs="+", action="append")
    for name in ("--load-timing-cache", "--save-timing-cache", "--pool-limit", "--builder-optimization-level",
                 "--profiling-verbosity"):
        p.add_argument(name)
    return p


def _modelopt() -> _Parser:
    p = _Parser(prog="python -m modelopt.onnx.quantization", allow_abbrev=False)
    p.add_argument("--onnx_path", required=True)
    p.add_argument("--output_path")
    p.add_argument("--quantize_mode", choices=("int8", "fp8", "int4"), default="int8")
    p.add_argument("--calibration_method")
    p.add_argument("--calibration_data_path")
    p.add_argument("--nodes_to_exclude", nargs="+", default=[])
    p.add_argument("--op_types_to_exclude", nargs="+", default=[])
    return p


def _run(command: str, tool: list[str], parser: _Parser) -> argparse.Namespace:
    argv = shlex.split(command)
    assert argv[:len(tool)] == tool
    return parser.parse_args(argv[len(tool):])


_TRT_SHAPES = re.compile(r"^('[^']+'|[^:,']+):\d+(x\d+)*$")  # name:AxBxC, quoted when it holds : or ,
_POLY_SHAPE = re.compile(r"^(.+):\[(\d+(,\d+)*)\]$")  # name:[A,B,C]


def _trtexec_shapes(value: str) -> dict[str, tuple[int, ...]]:
    # Split on commas outside single quotes, the way trtexec reads a shape list.
    parts = re.findall(r"(?:'[^']*'|[^,'])+", value)
    found = {}
    for part in parts:
        assert _TRT_SHAPES.match(part), part
        name, dims = part.rsplit(":", 1)
        found[name.strip("'")] = tuple(int(d) for d in dims.split("x"))
    return found


def _poly_shapes(values: list[str]) -> dict[str, tuple[int, ...]]:
    found = {}
    for value in values:
        match = _POLY_SHAPE.match(value)
        assert match, value
        found[match.group(1)] = tuple(int(d) for d in match.group(2).split(","))
    return found


SPEC = EngineBuildSpec(
    model=Path("/data/my models/mixed.onnx"),
    shapes={"images": ShapeRange((1, 3, 32, 32), (8, 3, 32, 32), (32, 3, 32, 32)),
            "input:0": ShapeRange((1, 7), (8, 7), (32, 7))},
    engine=Path("/data/my models/mixed.engine"), timing_cache=Path("/tmp/t.cache"),
    exclude=("/blocks.3/fc2/MatMul", "head"), workspace_mib=512, builder_optimization_level=4, tf32=False)


def test_trtexec_commands_parse_with_the_profile_and_pinned_layers():
    commands = build_commands(SPEC, source="/data/model.onnx", calibration_data="/data/calib.npz")
    strong = _run(commands.trtexec, ["trtexec"], _trtexec())
    assert strong.onnx == str(SPEC.model) and strong.saveEngine == str(SPEC.engine)
    assert strong.stronglyTyped and not strong.int8 and strong.layerPrecisions is None
    for which in ("min", "opt", "max"):
        assert _trtexec_shapes(getattr(strong, f"{which}Shapes")) == {
            name: getattr(rng, which) for name, rng in SPEC.shapes.items()}
    assert strong.memPoolSize == "workspace:512M" and strong.noTF32
    weak = _run(commands.trtexec_weakly_typed, ["trtexec"], _trtexec())
    assert not weak.stronglyTyped and weak.int8 and weak.fp16 and weak.precisionConstraints == "obey"
    pinned = dict(item.rsplit(":", 1) for item in weak.layerPrecisions.split(","))
    assert pinned == {name: "fp16" for name in SPEC.exclude}


def test_polygraphy_commands_parse_with_the_same_profile():
    commands = build_commands(SPEC)
    convert = _run(commands.polygraphy_convert, ["polygraphy", "convert"], _polygraphy("convert"))
    assert (convert.model_file, convert.output) == (str(SPEC.model), str(SPEC.engine))
    assert convert.convert_to == "trt"
    assert convert.strongly_typed and not convert.tf32
    assert convert.load_timing_cache == convert.save_timing_cache == "/tmp/t.cache"
    run = _run(commands.polygraphy_run, ["polygraphy", "run"], _polygraphy("run"))
    assert run.trt and run.onnxrt and run.strongly_typed
    for parsed in (convert, run):
        for which in ("min", "opt", "max"):
            [values] = getattr(parsed, f"trt_{which}_shapes")
            assert _poly_shapes(values) == {name: getattr(rng, which) for name, rng in SPEC.shapes.items()}
    assert _poly_shapes(run.input_shapes) == {name: rng.opt for name, rng in SPEC.shapes.items()}


def test_modelopt_command_parses_with_every_excluded_node():
    weird = ("/blocks.3/fc2/MatMul", "name with space", "quote'd")
    args = _run(modelopt_command("/m/model.onnx", weird, output="out.onnx", calibration_data="c.npz"),
                ["python", "-m", "modelopt.onnx.quantization"], _modelopt())
    assert (args.onnx_path, args.output_path) == ("/m/model.onnx", "out.onnx")
    assert args.calibration_data_path == "c.npz"
    assert args.quantize_mode == "int8" and args.nodes_to_exclude == list(weird)
    bare = _run(modelopt_command("m.onnx", ()), ["python", "-m", "modelopt.onnx.quantization"], _modelopt())
    assert bare.nodes_to_exclude == [] and bare.output_path is None


def test_a_flag_the_tool_lacks_fails_the_grammar():
    with pytest.raises(_Refused, match="--layer-precisions"):
        _trtexec().parse_args(["--onnx=m.onnx", "--layer-precisions=a:fp16"])


def test_plan_with_build_names_the_real_files_in_every_command(tmp_path):
    mixed = tmp_path / "out dir" / "mixed4.onnx"
    mixed.parent.mkdir()
    onnx.save(models_lint.clean_conv_block(), str(mixed))
    plan = search_fallback(("conv1", "conv2"), lambda ex: float(len(ex)), FallbackTarget.min_metric(1.0))
    built = plan.with_build(mixed, source=tmp_path / "fp32.onnx", calibration_data=tmp_path / "calib.npz")
    data = json.loads(json.dumps(built.to_dict()))
    assert data["tensorrt"]["build"] is not None
    trt = _run(data["tensorrt"]["trtexec"], ["trtexec"], _trtexec())
    assert trt.onnx == str(mixed) and trt.saveEngine == str(mixed.with_suffix(".engine"))
    assert trt.stronglyTyped
    weak = _run(data["tensorrt"]["trtexec_weakly_typed"], ["trtexec"], _trtexec())
    assert weak.onnx == str(mixed) and weak.layerPrecisions == ",".join(f"{n}:fp16" for n in plan.exclude)
    mo = _run(data["modelopt"]["command"], ["python", "-m", "modelopt.onnx.quantization"], _modelopt())
    assert mo.onnx_path == str(tmp_path / "fp32.onnx") and mo.nodes_to_exclude == list(plan.exclude)
    assert mo.calibration_data_path == str(tmp_path / "calib.npz")
    assert type(plan).from_dict(data).commands == built.commands  # read back the same
