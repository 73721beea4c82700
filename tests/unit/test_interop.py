"""trtexec / Polygraphy command lines built from an EngineBuildSpec: exact strings and quoting."""
from __future__ import annotations

import json
import shlex
from dataclasses import fields, replace
from pathlib import Path

import models
import models_lint
import onnx
import pytest

from quantdbg.backends.tensorrt import BuildCommands, EngineBuildSpec, ShapeRange, TrtConfig, build_commands
from quantdbg.backends.tensorrt.commands import (
    polygraphy_convert_command,
    polygraphy_run_command,
    trtexec_command,
)
from quantdbg.config import Precision
from quantdbg.errors import ConfigError, FormatError, ModelError

SPEC = EngineBuildSpec(
    model=Path("/data/my models/mixed.onnx"),
    config=TrtConfig(
        shapes={"images": ShapeRange((1, 3, 224, 224), (8, 3, 224, 224), (32, 3, 224, 224)),
                "input:0": ShapeRange((1, 7), (8, 7), (32, 7))},
        save_engine=Path("/data/my models/mixed.plan"),
        timing_cache=Path("/tmp/timing.cache"),
        workspace_bytes=2048 << 20,
        builder_optimization_level=4,
        tf32=False),
    layer_info=Path("/data/layers.json"),
    exclude=("/blocks.3/fc2/MatMul", "head"),
)


def test_trtexec_command_exact():
    assert trtexec_command(SPEC) == (
        "trtexec '--onnx=/data/my models/mixed.onnx' --stronglyTyped "
        "'--minShapes=images:1x3x224x224,'\"'\"'input:0'\"'\"':1x7' "
        "'--optShapes=images:8x3x224x224,'\"'\"'input:0'\"'\"':8x7' "
        "'--maxShapes=images:32x3x224x224,'\"'\"'input:0'\"'\"':32x7' "
        "'--saveEngine=/data/my models/mixed.plan' --timingCacheFile=/tmp/timing.cache "
        "--memPoolSize=workspace:2048M --builderOptimizationLevel=4 --noTF32 "
        "--profilingVerbosity=detailed --exportLayerInfo=/data/layers.json")


def test_trtexec_arguments_survive_the_shell():
    args = shlex.split(trtexec_command(SPEC))
    assert args[1] == "--onnx=/data/my models/mixed.onnx"
    # trtexec's own syntax: a name containing ':' is wrapped in single quotes inside the spec.
    assert args[3] == "--minShapes=images:1x3x224x224,'input:0':1x7"
    assert args[6] == "--saveEngine=/data/my models/mixed.plan"


def test_polygraphy_convert_command_exact():
    assert polygraphy_convert_command(SPEC) == (
        "polygraphy convert '/data/my models/mixed.onnx' --convert-to trt -o '/data/my models/mixed.plan' "
        "--profiling-verbosity detailed --strongly-typed "
        "--trt-min-shapes 'images:[1,3,224,224]' 'input:0:[1,7]' "
        "--trt-opt-shapes 'images:[8,3,224,224]' 'input:0:[8,7]' "
        "--trt-max-shapes 'images:[32,3,224,224]' 'input:0:[32,7]' "
        "--load-timing-cache /tmp/timing.cache --save-timing-cache /tmp/timing.cache "
        "--pool-limit workspace:2048M --builder-optimization-level 4")


def test_polygraphy_run_command_exact_with_tf32_and_no_extras():
    spec = EngineBuildSpec(Path("m.onnx"), TrtConfig(shapes={"x": ShapeRange((1, 16), (4, 16), (8, 16))}))
    assert polygraphy_run_command(spec) == (
        "polygraphy run m.onnx --trt --onnxrt --strongly-typed --trt-min-shapes 'x:[1,16]' "
        "--trt-opt-shapes 'x:[4,16]' --trt-max-shapes 'x:[8,16]' --tf32 --input-shapes 'x:[4,16]'")
    assert trtexec_command(spec) == ("trtexec --onnx=m.onnx --stronglyTyped --minShapes=x:1x16 "
                                     "--optShapes=x:4x16 --maxShapes=x:8x16")


def test_static_model_needs_no_shape_flags():
    spec = EngineBuildSpec(Path("static.onnx"), TrtConfig(save_engine=Path("s.plan")))
    assert trtexec_command(spec) == "trtexec --onnx=static.onnx --stronglyTyped --saveEngine=s.plan"
    assert polygraphy_convert_command(spec) == (
        "polygraphy convert static.onnx --convert-to trt -o s.plan --strongly-typed --tf32")


def test_convert_needs_an_engine_path():
    with pytest.raises(ConfigError, match="set EngineBuildSpec.config.save_engine"):
        polygraphy_convert_command(EngineBuildSpec(Path("m.onnx")))


def test_build_commands_and_script():
    commands = build_commands(SPEC)
    assert commands.trtexec == trtexec_command(SPEC)
    assert commands.comment == ("# 2 node(s) kept in FP16 (cast in the model; the strongly typed build "
                                "follows it): '/blocks.3/fc2/MatMul', 'head'")
    script = commands.to_script().splitlines()
    assert script[:4] == ["#!/bin/sh", "set -e", commands.comment, commands.trtexec]
    assert f"# {commands.polygraphy_convert}" in script and f"# {commands.polygraphy_run}" in script
    assert BuildCommands.from_dict(json.loads(json.dumps(commands.to_dict()))) == commands


def test_spec_json_round_trip():
    assert EngineBuildSpec.from_dict(json.loads(json.dumps(SPEC.to_dict()))) == SPEC
    minimal = EngineBuildSpec(Path("m.onnx"), exclude_precision=Precision.FP32)
    assert EngineBuildSpec.from_dict(json.loads(json.dumps(minimal.to_dict()))) == minimal


def test_spec_and_commands_json_keep_their_keys():
    """Fallback plans (``quantdbg.fallback_plan/2``) embed these dicts: their keys are part of that format."""
    shapes = {"x": ShapeRange((1, 7), (2, 7), (4, 7))}
    spec = EngineBuildSpec(Path("m.onnx"), TrtConfig(shapes=shapes, save_engine=Path("e.plan")),
                           exclude=("a",))
    assert spec.to_dict() == {
        "model": "m.onnx", "config": TrtConfig(shapes=shapes, save_engine=Path("e.plan")).to_dict(),
        "layer_info": None, "exclude": ["a"], "exclude_precision": "fp16", "source": None,
        "calibration_data": None}
    # Plans written before TrtConfig held the settings spelled them flat, the workspace in MiB.
    legacy = {"model": "m.onnx", "shapes": {"x": {"min": [1, 7], "opt": [2, 7], "max": [4, 7]}},
              "engine": "e.plan", "timing_cache": None, "layer_info": None, "exclude": ["a"],
              "exclude_precision": "fp16", "workspace_mib": 3, "builder_optimization_level": None,
              "tf32": True}
    assert EngineBuildSpec.from_dict(legacy) == replace(
        spec, config=replace(spec.config, workspace_bytes=3 << 20))
    commands = BuildCommands("t", "c", "r")
    assert commands.to_dict() == {"trtexec": "t", "polygraphy_convert": "c", "polygraphy_run": "r",
                                  "comment": "", "trtexec_weakly_typed": "", "modelopt": ""}
    assert BuildCommands.from_dict({"trtexec": "t", "polygraphy_convert": "c", "polygraphy_run": "r"}) \
        == commands  # written before the comment existed
    with pytest.raises(FormatError, match=r"field 'exclude_precision': expected one of"):
        EngineBuildSpec.from_dict({**SPEC.to_dict(), "exclude_precision": "int4"})


def test_from_model_fills_the_batch_range(tmp_path):
    path = tmp_path / "dir with space" / "m.onnx"
    path.parent.mkdir()
    onnx.save(models_lint.clean_conv_block(), str(path))
    spec = EngineBuildSpec.from_model(path, TrtConfig(batch=(2, 4, 16), save_engine=tmp_path / "e.plan"),
                                      exclude=["conv2"], exclude_precision="fp32")
    assert dict(spec.config.shapes) == {"x": ShapeRange((2, 16, 8, 8), (4, 16, 8, 8), (16, 16, 8, 8))}
    assert spec.exclude == ("conv2",) and spec.exclude_precision is Precision.FP32
    assert "--minShapes=x:2x16x8x8" in shlex.split(trtexec_command(spec))


def test_from_model_refuses_other_dynamic_dims_without_a_range(tmp_path):
    path = tmp_path / "attn.onnx"
    model = models.attention_matmuls()
    model.graph.input[0].type.tensor_type.shape.dim[1].dim_param = "T"
    onnx.save(model, str(path))
    with pytest.raises(ConfigError, match=r"Input 'x' has shape \(N, T, 8\) with dynamic axes \[0, 1\]"):
        EngineBuildSpec.from_model(path)
    ranges = {"x": ShapeRange((1, 1, 8), (4, 5, 8), (8, 16, 8))}
    spec = EngineBuildSpec.from_model(path, TrtConfig(shapes=ranges))
    assert spec.config.shapes["x"].max == (8, 16, 8)


def test_from_model_missing_file(tmp_path):
    with pytest.raises(ModelError, match="does not exist"):
        EngineBuildSpec.from_model(tmp_path / "nope.onnx")


@pytest.mark.parametrize("kwargs, message", [
    ({"exclude": "conv"}, r"^EngineBuildSpec\.exclude takes a sequence of node names, not one string\.$"),
    ({"config": {"save_engine": "e.plan"}}, r"^EngineBuildSpec\.config must be a TrtConfig, got dict\.$"),
    ({"config": TrtConfig(load_engine="e.plan")}, "load_engine is set, but a build spec builds an engine"),
])
def test_spec_validation(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        EngineBuildSpec(Path("m.onnx"), **kwargs)


def test_one_trt_config_in_bytes_drives_the_engine_build_and_every_command():
    """The build settings live in TrtConfig only (bytes); the commands spell them in each tool's unit."""
    assert not {"workspace_mib", "shapes", "engine", "timing_cache", "tf32", "builder_optimization_level"} \
        & {f.name for f in fields(EngineBuildSpec)}
    for size, trtexec, polygraphy in ((3 << 30, "workspace:3072M", "workspace:3072M"),
                                      (1000, "workspace:1000B", "workspace:1000")):
        spec = EngineBuildSpec(Path("m.onnx"), TrtConfig(save_engine=Path("m.plan"), workspace_bytes=size))
        assert f"--memPoolSize={trtexec}" in shlex.split(trtexec_command(spec))
        convert = shlex.split(polygraphy_convert_command(spec))
        assert convert[convert.index("--pool-limit") + 1] == polygraphy
