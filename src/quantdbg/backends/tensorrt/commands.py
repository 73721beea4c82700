"""Ready-to-run trtexec and Polygraphy commands that build the engine a fallback plan describes.

The mixed-precision model a fallback plan writes already says everything TensorRT needs: INT8 where
Q/DQ pairs are, FP16 where the layers kept out of INT8 were cast. So every command here builds a
*strongly typed* network (``trtexec --stronglyTyped``, ``polygraphy ... --strongly-typed``) with no
precision flags; the excluded node names only appear in a comment, for the record.
(``trtexec_command(spec, strongly_typed=False)`` spells the weakly typed equivalent, which pins the
excluded nodes by name.)

Flags follow TensorRT 10's trtexec (``--onnx``, ``--stronglyTyped``, ``--minShapes/--optShapes/
--maxShapes``, ``--saveEngine``, ``--timingCacheFile``, ``--memPoolSize``, ``--builderOptimizationLevel``,
``--noTF32``, ``--profilingVerbosity``, ``--exportLayerInfo``) and Polygraphy's ``convert``/``run``
(``--convert-to trt``, ``--strongly-typed``, ``--trt-min-shapes``..., ``--load-timing-cache``,
``--save-timing-cache``, ``--pool-limit``, ``--builder-optimization-level``, ``--tf32``,
``--input-shapes``, ``--trt``, ``--onnxrt``). ModelOpt's command (``python -m
modelopt.onnx.quantization --onnx_path ... --nodes_to_exclude ...``) quantizes the FP32 original with
the same layers left out, for those who build their Q/DQ model with ModelOpt. Every argument is quoted
with :func:`shlex.quote`.
"""
from __future__ import annotations

import os
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, cast

import onnx

from quantdbg._json import Serializable
from quantdbg.backends.tensorrt.config import MAX_OPT_LEVEL, ShapeRange, optional_path, resolve_profile
from quantdbg.config import Precision
from quantdbg.errors import ConfigError, ModelError
from quantdbg.model import input_specs


@dataclass(frozen=True)
class EngineBuildSpec(Serializable):
    """What a TensorRT engine build needs, independent of the tool that runs it.

    Attributes:
        model: The mixed-precision (Q/DQ + FP16) ONNX model.
        shapes: Input name -> optimization-profile range, for every input with a dynamic dimension.
        engine: Where to save the engine (None: build only).
        timing_cache: Timing-cache file to read and update.
        layer_info: Where trtexec writes the engine inspector JSON (implies detailed profiling
            verbosity); read it back with :func:`quantdbg.backends.tensorrt.parse_engine_info`.
        exclude: ONNX nodes the plan keeps out of INT8 (recorded in the script comment).
        exclude_precision: Precision of those nodes in the model.
        workspace_mib: Workspace memory-pool limit in MiB (None: TensorRT's default).
        builder_optimization_level: 0-5 (None: TensorRT's default, 3).
        tf32: Allow TF32 for FP32 layers (trtexec's default; Polygraphy needs ``--tf32`` for it).
    """

    model: Path
    shapes: Mapping[str, ShapeRange] = field(default_factory=dict)
    engine: Path | None = None
    timing_cache: Path | None = None
    layer_info: Path | None = None
    exclude: tuple[str, ...] = ()
    exclude_precision: Precision = Precision.FP16
    workspace_mib: int | None = None
    builder_optimization_level: int | None = None
    tf32: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "model", Path(self.model))
        for name in ("engine", "timing_cache", "layer_info"):
            object.__setattr__(self, name, optional_path(getattr(self, name)))
        if isinstance(cast(object, self.exclude), str):  # a common slip, caught at run time
            raise ConfigError("EngineBuildSpec.exclude takes a sequence of node names, not one string.")
        object.__setattr__(self, "exclude", tuple(self.exclude))
        object.__setattr__(self, "exclude_precision", Precision(self.exclude_precision))
        for name, rng in self.shapes.items():
            if not isinstance(rng, ShapeRange):
                raise ConfigError(f"shapes[{name!r}] must be a ShapeRange, got {type(rng).__name__}.")
        object.__setattr__(self, "shapes", MappingProxyType(dict(self.shapes)))
        if self.workspace_mib is not None and self.workspace_mib <= 0:
            raise ConfigError(f"workspace_mib must be > 0 or None, got {self.workspace_mib}.")
        level = self.builder_optimization_level
        if level is not None and not 0 <= level <= MAX_OPT_LEVEL:
            raise ConfigError(f"builder_optimization_level must be in [0, {MAX_OPT_LEVEL}] or None, "
                              f"got {level}.")

    @classmethod
    def from_model(cls, model: str | os.PathLike[str], batch: tuple[int, int, int] = (1, 8, 32),
                   shapes: Mapping[str, ShapeRange] | None = None, *,
                   staged: str | os.PathLike[str] | None = None, **options: Any) -> EngineBuildSpec:
        """Reads the model's inputs and fills in the profile of every dynamic one.

        Args:
            model: Path of the mixed-precision ONNX model (only its graph inputs are read).
            batch: (min, opt, max) batch size for inputs whose only dynamic dimension is axis 0.
            shapes: Explicit ranges for other dynamic inputs (e.g. sequence length).
            staged: Where the model file is read now, when it is still to be moved to ``model``
                (outputs committed together); None reads ``model``.
            **options: Any other :class:`EngineBuildSpec` field (engine, exclude, ...).

        Returns:
            The spec.

        Raises:
            ModelError: The model file cannot be read.
            ConfigError: An input has a dynamic dimension other than axis 0 and no explicit range.
        """
        path = Path(staged if staged is not None else model)
        if not path.is_file():
            raise ModelError(f"Model file {str(path)!r} does not exist or is not a file.")
        try:
            proto = onnx.load(str(path), load_external_data=False)  # the graph inputs are all we need
        except Exception as err:  # protobuf raises several unrelated types
            raise ModelError(f"Cannot parse {str(path)!r} as an ONNX model: {err}") from err
        profile = resolve_profile(input_specs(proto), shapes or {}, batch)
        return cls(Path(model), profile, **options)


@dataclass(frozen=True)
class BuildCommands(Serializable):
    """The same engine build, spelled for each tool.

    Attributes:
        trtexec: Builds (and benchmarks) the engine with trtexec (strongly typed).
        polygraphy_convert: Builds the engine with ``polygraphy convert``.
        polygraphy_run: Builds it in memory and compares TensorRT's outputs with ONNX Runtime's.
        comment: Shell comment lines recording the excluded nodes.
        trtexec_weakly_typed: The weakly typed trtexec build, pinning the excluded nodes (if any) with
            ``--precisionConstraints=obey --layerPrecisions``.
        modelopt: ModelOpt's quantization of the FP32 original with the same nodes excluded
            (``--nodes_to_exclude``; "" when the original is unknown).
    """

    trtexec: str
    polygraphy_convert: str
    polygraphy_run: str
    comment: str = ""
    trtexec_weakly_typed: str = ""
    modelopt: str = ""

    def lines(self) -> tuple[tuple[str, str], ...]:
        """(what it does, command) for every command present, the trtexec build first; the weakly
        typed build only when it pins excluded layers (``comment`` names them)."""
        weakly = self.trtexec_weakly_typed if self.comment else ""
        found = (("trtexec (strongly typed)", self.trtexec),
                 ("trtexec (weakly typed, excluded layers pinned)", weakly),
                 ("polygraphy convert", self.polygraphy_convert),
                 ("polygraphy run (TensorRT vs ONNX Runtime)", self.polygraphy_run),
                 ("ModelOpt (same layers excluded)", self.modelopt))
        return tuple((what, command) for what, command in found if command)

    def to_script(self) -> str:
        """A POSIX shell script running the trtexec build, with the other tools' equivalents commented."""
        lines = ["#!/bin/sh", "set -e"]
        if self.comment:
            lines.append(self.comment)
        lines += [self.trtexec, "", "# Equivalent Polygraphy build:", f"# {self.polygraphy_convert}",
                  "# Compare TensorRT with ONNX Runtime on random inputs:", f"# {self.polygraphy_run}"]
        if self.comment and self.trtexec_weakly_typed:
            lines += ["# Weakly typed trtexec build (excluded layers pinned by name):",
                      f"# {self.trtexec_weakly_typed}"]
        if self.modelopt:
            lines += ["# The same exclusion with ModelOpt's quantizer:", f"# {self.modelopt}"]
        return "\n".join(lines) + "\n"


def _trtexec_name(name: str) -> str:
    # trtexec splits shape specs on ':' and ','; names containing them go in single quotes.
    return f"'{name}'" if any(c in name for c in ":,'") else name


def _trtexec_shapes(shapes: Mapping[str, ShapeRange], which: str) -> str:
    return ",".join(f"{_trtexec_name(name)}:{'x'.join(map(str, getattr(rng, which)))}"
                    for name, rng in shapes.items())


def _join(args: Sequence[str | os.PathLike[str]]) -> str:
    return " ".join(shlex.quote(str(a)) for a in args)


def _weakly_typed(spec: EngineBuildSpec) -> list[str]:
    # INT8 and the excluded nodes' precision enabled; those nodes pinned to it by name.
    precision = spec.exclude_precision.value
    args = ["--int8", f"--{precision}"]
    if spec.exclude:
        layers = ",".join(f"{_trtexec_name(name)}:{precision}" for name in spec.exclude)
        args += ["--precisionConstraints=obey", f"--layerPrecisions={layers}"]
    return args


def trtexec_command(spec: EngineBuildSpec, *, strongly_typed: bool = True) -> str:
    """The ``trtexec`` command line that builds ``spec``'s engine.

    Args:
        spec: The build.
        strongly_typed: Build with ``--stronglyTyped`` (precisions from the model's casts). False
            gives the weakly typed build instead: ``--int8`` and the excluded nodes' precision
            enabled, and those nodes pinned to it with ``--precisionConstraints=obey
            --layerPrecisions`` (TensorRT names an ONNX model's layers after its nodes).

    Returns:
        A shell-quoted command.
    """
    args: list[str] = ["trtexec", f"--onnx={spec.model}",
                       *(["--stronglyTyped"] if strongly_typed else _weakly_typed(spec))]
    if spec.shapes:
        args += [f"--{which}Shapes={_trtexec_shapes(spec.shapes, which)}" for which in ("min", "opt", "max")]
    if spec.engine is not None:
        args.append(f"--saveEngine={spec.engine}")
    if spec.timing_cache is not None:
        args.append(f"--timingCacheFile={spec.timing_cache}")
    if spec.workspace_mib is not None:
        args.append(f"--memPoolSize=workspace:{spec.workspace_mib}M")
    if spec.builder_optimization_level is not None:
        args.append(f"--builderOptimizationLevel={spec.builder_optimization_level}")
    if not spec.tf32:
        args.append("--noTF32")
    if spec.layer_info is not None:
        args += ["--profilingVerbosity=detailed", f"--exportLayerInfo={spec.layer_info}"]
    return _join(args)


def _polygraphy_common(spec: EngineBuildSpec) -> list[str]:
    args: list[str] = ["--strongly-typed"]
    for which in ("min", "opt", "max"):
        if spec.shapes:
            args.append(f"--trt-{which}-shapes")
            args += [f"{name}:[{','.join(map(str, getattr(rng, which)))}]"
                     for name, rng in spec.shapes.items()]
    if spec.timing_cache is not None:
        cache = str(spec.timing_cache)
        args += ["--load-timing-cache", cache, "--save-timing-cache", cache]
    if spec.workspace_mib is not None:
        args += ["--pool-limit", f"workspace:{spec.workspace_mib}M"]
    if spec.builder_optimization_level is not None:
        args += ["--builder-optimization-level", str(spec.builder_optimization_level)]
    if spec.tf32:
        args.append("--tf32")  # TensorRT's default, which Polygraphy turns off unless asked
    return args


def polygraphy_convert_command(spec: EngineBuildSpec) -> str:
    """The ``polygraphy convert`` command line equivalent to :func:`trtexec_command`.

    Args:
        spec: The build; ``spec.engine`` must be set (convert writes a file).

    Returns:
        A shell-quoted command.

    Raises:
        ConfigError: ``spec.engine`` is None.
    """
    if spec.engine is None:
        raise ConfigError("polygraphy convert writes the engine to a file: set EngineBuildSpec.engine.")
    args = ["polygraphy", "convert", str(spec.model), "--convert-to", "trt", "-o", str(spec.engine)]
    if spec.layer_info is not None:
        args += ["--profiling-verbosity", "detailed"]
    return _join(args + _polygraphy_common(spec))


def polygraphy_run_command(spec: EngineBuildSpec) -> str:
    """A ``polygraphy run`` command that builds the engine and compares it with ONNX Runtime.

    Inputs are random (Polygraphy's default data loader) at the profile's opt shapes.

    Args:
        spec: The build.

    Returns:
        A shell-quoted command.
    """
    args = ["polygraphy", "run", str(spec.model), "--trt", "--onnxrt", *_polygraphy_common(spec)]
    if spec.shapes:
        args.append("--input-shapes")
        args += [f"{name}:[{','.join(map(str, rng.opt))}]" for name, rng in spec.shapes.items()]
    return _join(args)


def modelopt_command(source: str | os.PathLike[str], exclude: Sequence[str], *,
                     output: str | os.PathLike[str] | None = None,
                     calibration_data: str | os.PathLike[str] | None = None) -> str:
    """ModelOpt's command line quantizing the FP32 ``source`` to INT8 with ``exclude`` left out.

    Args:
        source: The FP32 ONNX model (ModelOpt inserts its own Q/DQ pairs).
        exclude: Node names for ``--nodes_to_exclude`` (ModelOpt treats each as a pattern; ONNX node
            names rarely hold regex metacharacters other than ``.``, which still matches itself).
        output: ``--output_path`` (None: ModelOpt's default next to the source).
        calibration_data: ``--calibration_data_path``, a .npz of input name -> samples (None: ModelOpt
            calibrates on random data, so pass it whenever you have it).

    Returns:
        A shell-quoted command.
    """
    args = ["python", "-m", "modelopt.onnx.quantization", "--onnx_path", str(source),
            "--quantize_mode", "int8"]
    if calibration_data is not None:
        args += ["--calibration_data_path", str(calibration_data)]
    if exclude:
        args += ["--nodes_to_exclude", *exclude]
    if output is not None:
        args += ["--output_path", str(output)]
    return _join(args)


def build_commands(spec: EngineBuildSpec, source: str | os.PathLike[str] | None = None,
                   calibration_data: str | os.PathLike[str] | None = None) -> BuildCommands:
    """Every command for ``spec``, plus a comment naming the excluded nodes.

    Args:
        spec: The build; ``spec.engine`` must be set.
        source: The FP32 original of ``spec.model`` (None: no ModelOpt command).
        calibration_data: Calibration .npz for the ModelOpt command.

    Returns:
        The commands.

    Raises:
        ConfigError: ``spec.engine`` is None.
    """
    comment = ""
    if spec.exclude:
        comment = (f"# {len(spec.exclude)} node(s) kept in {spec.exclude_precision.value.upper()} "
                   f"(cast in the model; the strongly typed build follows it): "
                   + ", ".join(" ".join(name.split()) for name in spec.exclude))
    weakly = trtexec_command(spec, strongly_typed=False)
    modelopt = "" if source is None else modelopt_command(
        source, spec.exclude, output=spec.model.with_name(f"{spec.model.stem}.modelopt.onnx"),
        calibration_data=calibration_data)
    return BuildCommands(trtexec_command(spec), polygraphy_convert_command(spec),
                         polygraphy_run_command(spec), comment, weakly, modelopt)
