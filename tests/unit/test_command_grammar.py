"""The emitted trtexec / Polygraphy / ModelOpt command lines parse under each tool's documented flags.

The parsers (``tests/tool_grammars.py``) mirror the flags as the tools document them: a flag that a
tool does not know, a missing value or a malformed shape spec fails the parse, so each test checks the
command a user would paste, not a string compared with itself.
"""
from __future__ import annotations

import json
from pathlib import Path

import models_lint
import onnx
import pytest
from tool_grammars import (
    Refused,
    execute,
    modelopt,
    poly_shapes,
    polygraphy,
    run,
    stub_tools,
    trtexec,
    trtexec_shapes,
)

from quantdbg.backends.tensorrt import EngineBuildSpec, ShapeRange, TrtConfig, build_commands
from quantdbg.backends.tensorrt.commands import modelopt_command, trtexec_command
from quantdbg.errors import ConfigError
from quantdbg.fallback import FallbackTarget, search_fallback
from quantdbg.report.sections.fallback import fallback_sections

SHAPES = {"images": ShapeRange((1, 3, 32, 32), (8, 3, 32, 32), (32, 3, 32, 32)),
          "input:0": ShapeRange((1, 7), (8, 7), (32, 7))}
SPEC = EngineBuildSpec(
    model=Path("/data/my models/mixed.onnx"),
    config=TrtConfig(shapes=SHAPES, save_engine=Path("/data/my models/mixed.engine"),
                     timing_cache=Path("/tmp/t.cache"), workspace_bytes=512 << 20,
                     builder_optimization_level=4, tf32=False),
    exclude=("/blocks.3/fc2/MatMul", "head"), source=Path("/data/model.onnx"),
    calibration_data=Path("/data/calib.npz"))


def test_trtexec_commands_parse_with_the_profile_and_pinned_layers():
    commands = build_commands(SPEC)
    strong = run(commands.trtexec, ["trtexec"], trtexec())
    assert strong.onnx == str(SPEC.model) and strong.saveEngine == str(SPEC.config.save_engine)
    assert strong.stronglyTyped and not strong.int8 and strong.layerPrecisions is None
    for which in ("min", "opt", "max"):
        assert trtexec_shapes(getattr(strong, f"{which}Shapes")) == {
            name: getattr(rng, which) for name, rng in SHAPES.items()}
    assert strong.memPoolSize == "workspace:512M" and strong.noTF32
    weak = run(commands.trtexec_weakly_typed, ["trtexec"], trtexec())
    assert not weak.stronglyTyped and weak.int8 and weak.fp16 and weak.precisionConstraints == "obey"
    pinned = dict(item.rsplit(":", 1) for item in weak.layerPrecisions.split(","))
    assert pinned == {name: "fp16" for name in SPEC.exclude}


def test_polygraphy_commands_parse_with_the_same_profile():
    commands = build_commands(SPEC)
    convert = run(commands.polygraphy_convert, ["polygraphy", "convert"], polygraphy("convert"))
    assert (convert.model_file, convert.output) == (str(SPEC.model), str(SPEC.config.save_engine))
    assert convert.convert_to == "trt"
    assert convert.strongly_typed and not convert.tf32
    assert convert.load_timing_cache == convert.save_timing_cache == "/tmp/t.cache"
    ran = run(commands.polygraphy_run, ["polygraphy", "run"], polygraphy("run"))
    assert ran.trt and ran.onnxrt and ran.strongly_typed
    for parsed in (convert, ran):
        for which in ("min", "opt", "max"):
            [values] = getattr(parsed, f"trt_{which}_shapes")
            assert poly_shapes(values) == {name: getattr(rng, which) for name, rng in SHAPES.items()}
    assert poly_shapes(ran.input_shapes) == {name: rng.opt for name, rng in SHAPES.items()}


def test_modelopt_command_parses_with_every_excluded_node():
    weird = ("/blocks.3/fc2/MatMul", "name with space", "quote'd")
    args = run(modelopt_command("/m/model.onnx", weird, output="out.onnx", calibration_data="c.npz"),
                ["python", "-m", "modelopt.onnx.quantization"], modelopt())
    assert (args.onnx_path, args.output_path) == ("/m/model.onnx", "out.onnx")
    assert args.calibration_data_path == "c.npz"
    assert args.quantize_mode == "int8" and args.nodes_to_exclude == list(weird)
    bare = run(modelopt_command("m.onnx", ()), ["python", "-m", "modelopt.onnx.quantization"], modelopt())
    assert bare.nodes_to_exclude == [] and bare.output_path is None


def test_a_flag_the_tool_lacks_fails_the_grammar():
    with pytest.raises(Refused, match="--layer-precisions"):
        trtexec().parse_args(["--onnx=m.onnx", "--layer-precisions=a:fp16"])


def test_plan_with_build_names_the_real_files_in_every_command(tmp_path):
    mixed = tmp_path / "out dir" / "mixed4.onnx"
    mixed.parent.mkdir()
    onnx.save(models_lint.clean_conv_block(), str(mixed))
    plan = search_fallback(("conv1", "conv2"), lambda ex: float(len(ex)), FallbackTarget.min_metric(1.0))
    built = plan.with_build(mixed, source=tmp_path / "fp32.onnx", calibration_data=tmp_path / "calib.npz")
    data = json.loads(json.dumps(built.to_dict()))
    assert data["tensorrt"]["build"] is not None
    trt = run(data["tensorrt"]["trtexec"], ["trtexec"], trtexec())
    assert trt.onnx == str(mixed) and trt.saveEngine == str(mixed.with_suffix(".engine"))
    assert trt.stronglyTyped
    weak = run(data["tensorrt"]["trtexec_weakly_typed"], ["trtexec"], trtexec())
    assert weak.onnx == str(mixed) and weak.layerPrecisions == ",".join(f"{n}:fp16" for n in plan.exclude)
    mo = run(data["modelopt"]["command"], ["python", "-m", "modelopt.onnx.quantization"], modelopt())
    assert mo.onnx_path == str(tmp_path / "fp32.onnx") and mo.nodes_to_exclude == list(plan.exclude)
    assert mo.calibration_data_path == str(tmp_path / "calib.npz")
    assert type(plan).from_dict(data).commands == built.commands  # read back the same


# --------------------------------------------------------------------------------------------
# Names are data, never code: hostile node names and paths, run through a shell against stub tools
# --------------------------------------------------------------------------------------------

_TOUCH = "touch pwned"
"""What a hostile name runs if a shell reads it as code (the commands run in the test's folder)."""


def _hostile() -> tuple[str, ...]:
    """Node names that would run :data:`_TOUCH` if a shell read them as code."""
    touch = _TOUCH
    return (f"conv2/Conv\n{touch} #", f"a; {touch}", f"$({touch})", f"`{touch}`", 'dq"uote', "with  space")


def _hostile_spec(tmp_path: Path, names: tuple[str, ...]) -> EngineBuildSpec:
    folder = tmp_path / f"my dir; {_TOUCH} $({_TOUCH})\n`{_TOUCH}` 'q' \"d\""  # never created: only named
    shapes = {f"in put$({_TOUCH})": ShapeRange((1, 3), (8, 3), (32, 3))}
    config = TrtConfig(shapes=shapes, save_engine=folder / "mixed.engine", timing_cache=folder / "t;.cache")
    return EngineBuildSpec(folder / "mixed.onnx", config, exclude=names, source=folder / "model.onnx",
                           calibration_data=folder / "calib.npz")


def _check_argv(calls: list[list[str]], spec: EngineBuildSpec) -> None:
    """Every recorded call parses under its tool's grammar and carries the names and paths exactly."""
    input_name = next(iter(spec.config.shapes))
    for tool, *argv in calls:
        if tool == "trtexec":
            args = trtexec().parse_args(argv)
            assert args.onnx == str(spec.model) and args.saveEngine == str(spec.config.save_engine)
            assert set(trtexec_shapes(args.minShapes)) == {input_name}
            if args.layerPrecisions is not None:
                pinned = [item.rsplit(":", 1)[0] for item in args.layerPrecisions.split(",")]
                assert pinned == list(spec.exclude)
        elif tool == "polygraphy":
            args = polygraphy(argv[0]).parse_args(argv[1:])
            assert args.model_file == str(spec.model)
            assert args.load_timing_cache == str(spec.config.timing_cache)
            assert set(poly_shapes(args.trt_min_shapes[0])) == {input_name}
        else:
            assert argv[:2] == ["-m", "modelopt.onnx.quantization"]
            args = modelopt().parse_args(argv[2:])
            assert args.nodes_to_exclude == list(spec.exclude) and args.onnx_path == str(spec.source)
            assert args.calibration_data_path == str(spec.calibration_data)


def test_hostile_names_and_paths_stay_data_in_the_script_and_every_command(tmp_path):
    marker = tmp_path / "pwned"
    stubs = stub_tools(tmp_path / "bin")
    spec = _hostile_spec(tmp_path, _hostile())
    commands = build_commands(spec)
    calls = execute(commands.to_script(), tmp_path, stubs)
    assert [call[0] for call in calls] == ["trtexec"]  # the script runs the build; the rest is comments
    for _, command in commands.lines():
        calls += execute(command, tmp_path, stubs)
    assert not marker.exists()
    assert sorted({call[0] for call in calls}) == ["polygraphy", "python", "trtexec"] and len(calls) == 6
    _check_argv(calls, spec)
    assert any(call[0] == "trtexec" and "--layerPrecisions" in " ".join(call) for call in calls)


def test_names_no_tool_syntax_can_carry_leave_that_form_out_and_say_why(tmp_path):
    marker = tmp_path / "pwned"
    stubs = stub_tools(tmp_path / "bin")
    names = (*_hostile(), "it's", "-leading", "a:b,c")
    spec = _hostile_spec(tmp_path, names)
    commands = build_commands(spec)
    assert commands.trtexec_weakly_typed == "" and commands.modelopt == ""
    assert ("No weakly typed trtexec build: trtexec's --layerPrecisions=NAME:PRECISION,... cannot spell node "
            "\"it's\" (and 1 more)") in commands.comment
    assert "No ModelOpt command: its --nodes_to_exclude reads a node name starting with '-'" \
        in commands.comment
    calls = execute(commands.to_script(), tmp_path, stubs)
    for _, command in commands.lines():
        calls += execute(command, tmp_path, stubs)
    assert not marker.exists()
    assert [call[0] for call in calls] == ["trtexec", "trtexec", "polygraphy", "polygraphy"]
    _check_argv(calls, spec)
    with pytest.raises(ConfigError, match=r"^trtexec's --layerPrecisions=NAME:PRECISION,\.\.\. cannot spell "
                                          r"node \"it's\" \(and 1 more\): .* Build strongly typed instead"):
        trtexec_command(spec, strongly_typed=False)
    with pytest.raises(ConfigError, match=r"^Node '-leading': ModelOpt's --nodes_to_exclude reads a name "
                                          r"starting with '-' as a flag; rename the node in the model\.$"):
        modelopt_command("m.onnx", names)


def test_a_relative_path_starting_with_a_dash_is_never_read_as_a_flag(tmp_path):
    stubs = stub_tools(tmp_path / "bin")
    spec = EngineBuildSpec(Path("-mixed.onnx"), TrtConfig(save_engine=Path("-mixed.engine"),
                                                          timing_cache=Path("-t.cache")),
                           exclude=("a",), source=Path("-model.onnx"), calibration_data=Path("-calib.npz"))
    calls = []
    for _, command in build_commands(spec).lines():
        calls += execute(command, tmp_path, stubs)
    found = {(call[0], call[1]) for call in calls}
    assert found == {("trtexec", "--onnx=-mixed.onnx"), ("polygraphy", "convert"), ("polygraphy", "run"),
                     ("python", "-m")}
    convert = polygraphy("convert").parse_args(next(c for c in calls if c[1:2] == ["convert"])[2:])
    assert (convert.model_file, convert.output, convert.load_timing_cache) == (
        "./-mixed.onnx", "./-mixed.engine", "./-t.cache")
    mo = modelopt().parse_args(next(c for c in calls if c[0] == "python")[3:])
    assert (mo.onnx_path, mo.calibration_data_path) == ("./-model.onnx", "./-calib.npz")


def test_a_plan_read_back_rebuilds_its_commands_and_never_replays_the_file(tmp_path):
    marker = tmp_path / "pwned"
    stubs = stub_tools(tmp_path / "bin")
    mixed = tmp_path / "mixed.onnx"
    onnx.save(models_lint.clean_conv_block(), str(mixed))
    names = _hostile()
    plan = search_fallback(names, lambda ex: float(len(ex)), FallbackTarget.min_metric(float(len(names))))
    path = plan.with_build(mixed, source=tmp_path / "fp32.onnx").write(tmp_path / "plan.json")
    data = json.loads(path.read_text())
    for section, key in ((data["tensorrt"]["build"]["commands"], "trtexec"), (data["tensorrt"], "trtexec"),
                         (data["modelopt"], "command")):
        section[key] = _TOUCH  # a hand-edited (or hostile) file
    data["tensorrt"]["build"]["commands"]["comment"] = f"# x\n{_TOUCH}"
    path.write_text(json.dumps(data))
    read = type(plan).read(path)
    assert read.commands == build_commands(read.build) and read.build.exclude == names
    calls = execute(read.commands.to_script(), tmp_path, stubs)
    [[tool, *argv]] = calls
    assert tool == "trtexec" and trtexec().parse_args(argv).onnx == str(mixed)
    for code in fallback_sections(read)[0].code:  # the report's Build section, pasted into a shell
        calls += execute(code, tmp_path, stubs)
    assert not marker.exists() and len(calls) == 6


def test_the_report_build_section_of_a_plan_without_files_keeps_names_commented(tmp_path):
    stubs = stub_tools(tmp_path / "bin")
    names = _hostile()
    plan = search_fallback(names, lambda ex: float(len(ex)), FallbackTarget.min_metric(float(len(names))))
    [code] = fallback_sections(plan)[0].code
    assert "# ModelOpt: --nodes_to_exclude " in code  # no source model: ModelOpt's flag, as a comment
    calls = execute(code, tmp_path, stubs)
    assert not (tmp_path / "pwned").exists()
    assert [call[0] for call in calls] == ["trtexec", "trtexec", "polygraphy", "polygraphy"]
    pinned = trtexec().parse_args(calls[1][1:]).layerPrecisions
    assert [item.rsplit(":", 1)[0] for item in pinned.split(",")] == list(names)
