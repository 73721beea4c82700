"""The documented grammars of trtexec, Polygraphy and ModelOpt's command lines, and stub executables
that record the argv a shell hands them, for tests that check emitted commands the way a user runs them.

The parsers mirror the flags as the tools document them (trtexec ``--help`` of TensorRT 10,
``polygraphy convert``/``run`` of Polygraphy 0.49, ``python -m modelopt.onnx.quantization``): a flag
that a tool does not know, a missing value or a malformed shape spec fails the parse.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path


class Refused(Exception):
    pass


class Parser(argparse.ArgumentParser):
    def error(self, message: str):  # raise instead of exiting, so the test names the flag
        raise Refused(message)


def trtexec() -> Parser:
    # trtexec takes every option as --name=value (or a bare switch).
    p = Parser(prog="trtexec", prefix_chars="-", allow_abbrev=False)
    p.add_argument("--onnx", required=True)
    for switch in ("--stronglyTyped", "--int8", "--fp16", "--noTF32", "--best"):
        p.add_argument(switch, action="store_true")
    for name in ("--minShapes", "--optShapes", "--maxShapes", "--saveEngine", "--timingCacheFile",
                 "--memPoolSize", "--builderOptimizationLevel", "--profilingVerbosity", "--exportLayerInfo",
                 "--precisionConstraints", "--layerPrecisions"):
        p.add_argument(name)
    return p


def polygraphy(subcommand: str) -> Parser:
    p = Parser(prog=f"polygraphy {subcommand}", allow_abbrev=False)
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


def modelopt() -> Parser:
    p = Parser(prog="python -m modelopt.onnx.quantization", allow_abbrev=False)
    p.add_argument("--onnx_path", required=True)
    p.add_argument("--output_path")
    p.add_argument("--quantize_mode", choices=("int8", "fp8", "int4"), default="int8")
    p.add_argument("--calibration_method")
    p.add_argument("--calibration_data_path")
    p.add_argument("--nodes_to_exclude", nargs="+", default=[])
    p.add_argument("--op_types_to_exclude", nargs="+", default=[])
    return p


def run(command: str, tool: list[str], parser: Parser) -> argparse.Namespace:
    argv = shlex.split(command)
    assert argv[:len(tool)] == tool
    return parser.parse_args(argv[len(tool):])


_TRT_SHAPES = re.compile(r"^('[^']+'|[^:,']+):\d+(x\d+)*$")  # name:AxBxC, quoted when it holds : or ,
_POLY_SHAPE = re.compile(r"^(.+):\[(\d+(,\d+)*)\]$")  # name:[A,B,C]


def trtexec_shapes(value: str) -> dict[str, tuple[int, ...]]:
    # Split on commas outside single quotes, the way trtexec reads a shape list.
    parts = re.findall(r"(?:'[^']*'|[^,'])+", value)
    found = {}
    for part in parts:
        assert _TRT_SHAPES.match(part), part
        name, dims = part.rsplit(":", 1)
        found[name.strip("'")] = tuple(int(d) for d in dims.split("x"))
    return found


def poly_shapes(values: list[str]) -> dict[str, tuple[int, ...]]:
    found = {}
    for value in values:
        match = _POLY_SHAPE.match(value)
        assert match, value
        found[match.group(1)] = tuple(int(d) for d in match.group(2).split(","))
    return found


_STUB = """#!{python}
import json, os, sys
with open(os.environ["STUB_LOG"], "a", encoding="utf-8") as log:
    log.write(json.dumps([{tool!r}, *sys.argv[1:]]) + "\\n")
"""


def stub_tools(folder: Path) -> Path:
    """``trtexec``, ``polygraphy`` and ``python`` executables that only record their argv."""
    folder.mkdir()
    for tool in ("trtexec", "polygraphy", "python"):
        stub = folder / tool
        stub.write_text(_STUB.format(python=sys.executable, tool=tool))
        stub.chmod(0o755)
    return folder


def execute(script: str, cwd: Path, stubs: Path) -> list[list[str]]:
    """Runs ``script`` with bash, the stubs first on PATH; the argv every stub received."""
    log = cwd / "argv.jsonl"
    log.unlink(missing_ok=True)
    env = {**os.environ, "PATH": f"{stubs}{os.pathsep}{os.environ['PATH']}", "STUB_LOG": str(log)}
    done = subprocess.run(["bash", "-c", script], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in log.read_text(encoding="utf-8").splitlines()] if log.exists() else []
