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
the same layers left out, for those who build their Q/DQ model with ModelOpt.

Names are data, never code: every argument is quoted with :func:`shlex.quote`, a relative path that
starts with ``-`` gets ``./`` so no tool takes it for a flag, comments show names as Python literals
(a newline in a name cannot end a comment line), and a name a tool's own syntax cannot spell is refused
with an error naming it (the build commands then leave that tool's form out and say why).
"""
from __future__ import annotations

import os
import shlex
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, cast

import numpy as np
import onnx

from quantdbg import _json
from quantdbg._json import Serializable
from quantdbg.backends.tensorrt.config import (
    ShapeRange,
    TrtConfig,
    batch_profile,
    optional_path,
    resolve_profile,
)
from quantdbg.config import Precision
from quantdbg.data import DEFAULT_BATCH_SIZE, DataSource, as_data
from quantdbg.errors import ConfigError, FormatError, ModelError
from quantdbg.model.specs import input_specs

MIB = 1 << 20
"""Bytes in a MiB: the unit both tools' pool-size flags are written in when the size allows."""


@dataclass(frozen=True)
class EngineBuildSpec(Serializable):
    """What a TensorRT engine build needs, independent of the tool that runs it.

    Attributes:
        model: The mixed-precision (Q/DQ + FP16) ONNX model.
        config: The build settings (:class:`~quantdbg.backends.tensorrt.TrtConfig`, the one home of
            them): ``config.shapes`` is the optimization profile the commands spell (every input with
            a dynamic dimension; :meth:`from_model` fills it in), ``config.save_engine`` where the
            engine goes (None: build only), then the workspace limit (bytes), the optimization level,
            TF32 and the timing cache. ``config.batch`` only serves :meth:`from_model`.
        layer_info: Where trtexec writes the engine inspector JSON (implies detailed profiling
            verbosity); read it back with :func:`quantdbg.backends.tensorrt.parse_engine_info`.
        exclude: ONNX nodes the plan keeps out of INT8 (recorded in the script comment).
        exclude_precision: Precision of those nodes in the model.
        source: The FP32 original of ``model``, for ModelOpt's equivalent command (None: none).
        calibration_data: The calibration ``.npz``, for ModelOpt's ``--calibration_data_path``.
    """

    model: Path
    config: TrtConfig = field(default_factory=TrtConfig)
    layer_info: Path | None = None
    exclude: tuple[str, ...] = ()
    exclude_precision: Precision = Precision.FP16
    source: Path | None = None
    calibration_data: Path | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "model", Path(self.model))
        for name in ("layer_info", "source", "calibration_data"):
            object.__setattr__(self, name, optional_path(getattr(self, name)))
        if isinstance(cast(object, self.exclude), str):  # a common slip, caught at run time
            raise ConfigError("EngineBuildSpec.exclude takes a sequence of node names, not one string.")
        object.__setattr__(self, "exclude", tuple(self.exclude))
        object.__setattr__(self, "exclude_precision", Precision(self.exclude_precision))
        if not isinstance(self.config, TrtConfig):
            raise ConfigError(f"EngineBuildSpec.config must be a TrtConfig, got "
                              f"{type(self.config).__name__}.")
        if self.config.load_engine is not None:
            raise ConfigError("EngineBuildSpec.config.load_engine is set, but a build spec builds an engine; "
                              "set save_engine instead.")

    @classmethod
    def from_model(cls, model: str | os.PathLike[str], config: TrtConfig | None = None, *,
                   data: DataSource | None = None, batch_size: int | None = None,
                   graph: onnx.ModelProto | str | os.PathLike[str] | None = None,
                   **options: Any) -> EngineBuildSpec:
        """Reads the model's inputs and fills in the optimization profile of every dynamic one.

        The profile rule of every command: a dynamic axis 0 gets min 1, opt and max ``batch_size``
        (:func:`~quantdbg.backends.tensorrt.config.batch_profile`); another dynamic axis (a sequence length)
        the smallest and largest size it has in ``data``; fixed axes come from the model.

        Args:
            model: Path of the mixed-precision ONNX model the commands build.
            config: Build settings; its ``shapes`` win, and its ``batch`` is used as given (None:
                ``TrtConfig(batch=batch_profile(batch_size))``).
            data: The data the model was evaluated on: the extents of its non-batch dynamic axes,
                and the batch size when ``batch_size`` is None (its largest feed).
            batch_size: The batch size the model was calibrated and evaluated with (None: from
                ``data``, else 32).
            graph: Where the inputs are read instead of ``model``: the model in memory, or the file
                it is in now (outputs committed together are moved to ``model`` later).
            **options: Any other :class:`EngineBuildSpec` field (exclude, source, ...).

        Returns:
            The spec, ``config.shapes`` holding the range of every dynamic input.

        Raises:
            ModelError: The model file cannot be read.
            ConfigError: An input has a dynamic dimension other than axis 0 that neither the data nor
                ``config.shapes`` covers.
        """
        proto = _graph(graph if graph is not None else model)
        seen = data_extents(data) if data is not None else {}
        if config is None:
            size = batch_size or max((rng.max[0] for rng in seen.values() if rng.max), default=0)
            config = TrtConfig(batch=batch_profile(size or DEFAULT_BATCH_SIZE))
        shapes = resolve_profile(input_specs(proto), config.shapes, config.batch, seen)
        return cls(Path(model), replace(config, shapes=shapes), **options)

    def engine_beside(self) -> EngineBuildSpec:
        """This spec saving the engine beside the model (``m.onnx`` -> ``m.engine``) unless
        ``config.save_engine`` already says where."""
        if self.config.save_engine is not None:
            return self
        return replace(self, config=replace(self.config, save_engine=self.model.with_suffix(".engine")))

    @classmethod
    def __json_decode__(cls, data: Any, where: str) -> EngineBuildSpec:
        if not isinstance(data, dict):
            raise _json.fail(where, "an object (EngineBuildSpec)", data)
        data = _current_form(data)
        hints = typing.get_type_hints(cls)
        values = {f.name: _json.decode(hints[f.name], data[f.name], f"{where}.{f.name}" if where else f.name)
                  for f in fields(cls) if f.name in data}
        if "model" not in values:
            raise FormatError(f"field {where + '.model' if where else 'model'!r} is missing")
        return _json.construct(cls, values, where)


def _current_form(data: dict[str, Any]) -> dict[str, Any]:
    """A spec as plans written before :class:`TrtConfig` held the settings spelled it (``shapes``,
    ``engine``, ``timing_cache``, ``workspace_mib``, ...), in today's form."""
    if "config" in data:
        return data
    legacy = ("shapes", "engine", "timing_cache", "workspace_mib", "builder_optimization_level", "tf32")
    mib = data.get("workspace_mib")
    config = {"shapes": data.get("shapes", {}), "save_engine": data.get("engine"),
              "timing_cache": data.get("timing_cache"),
              "workspace_bytes": mib * MIB if isinstance(mib, int) and not isinstance(mib, bool) else mib,
              "builder_optimization_level": data.get("builder_optimization_level"),
              "tf32": data.get("tf32", True)}
    return {**{k: v for k, v in data.items() if k not in legacy}, "config": config}


def _graph(model: onnx.ModelProto | str | os.PathLike[str]) -> onnx.ModelProto:
    if isinstance(model, onnx.ModelProto):
        return model
    path = Path(model)
    if not path.is_file():
        raise ModelError(f"Model file {str(path)!r} does not exist or is not a file.")
    try:
        return onnx.load(str(path), load_external_data=False)  # the graph inputs are all we need
    except Exception as err:  # protobuf raises several unrelated types
        raise ModelError(f"Cannot parse {str(path)!r} as an ONNX model: {err}") from err


def data_extents(data: DataSource) -> dict[str, ShapeRange]:
    """Input name -> the smallest (min) and largest (opt and max) size of each axis over the feeds of
    ``data`` (inputs whose rank varies are left out)."""
    shapes: dict[str, list[tuple[int, ...]]] = {}
    for feed in as_data(data):
        for name, value in feed.items():
            shapes.setdefault(name, []).append(tuple(int(d) for d in np.shape(value)))
    extents = {}
    for name, seen in shapes.items():
        if len({len(s) for s in seen}) == 1:
            high = tuple(map(max, zip(*seen, strict=True)))
            extents[name] = ShapeRange(tuple(map(min, zip(*seen, strict=True))), high, high)
    return extents


@dataclass(frozen=True)
class BuildCommands(Serializable):
    """The same engine build, spelled for each tool.

    Attributes:
        trtexec: Builds (and benchmarks) the engine with trtexec (strongly typed).
        polygraphy_convert: Builds the engine with ``polygraphy convert``.
        polygraphy_run: Builds it in memory and compares TensorRT's outputs with ONNX Runtime's.
        comment: Shell comment lines recording the excluded nodes (names as Python literals) and
            why a form is left out.
        trtexec_weakly_typed: The weakly typed trtexec build, pinning the excluded nodes (if any) with
            ``--precisionConstraints=obey --layerPrecisions`` ("" when trtexec cannot spell a name).
        modelopt: ModelOpt's quantization of the FP32 original with the same nodes excluded
            (``--nodes_to_exclude``; "" when the original is unknown or a name cannot be passed).
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
        """A POSIX shell script running the trtexec build, with the other tools' equivalents commented.

        Every commented line starts with ``#`` even where a quoted name or path holds a line break,
        so only the trtexec build runs."""
        lines = ["#!/bin/sh", "set -e"]
        if self.comment:
            lines.append(as_comment(self.comment))
        lines += [self.trtexec, "", "# Equivalent Polygraphy build:", as_comment(self.polygraphy_convert),
                  "# Compare TensorRT with ONNX Runtime on random inputs:", as_comment(self.polygraphy_run)]
        if self.comment and self.trtexec_weakly_typed:
            lines += ["# Weakly typed trtexec build (excluded layers pinned by name):",
                      as_comment(self.trtexec_weakly_typed)]
        if self.modelopt:
            lines += ["# The same exclusion with ModelOpt's quantizer:", as_comment(self.modelopt)]
        return "\n".join(lines) + "\n"


def as_comment(text: str) -> str:
    """``text`` as shell comment lines: every line it spans (any line boundary) starts with ``#``."""
    return "\n".join(line if line.startswith("#") else f"# {line}" for line in text.splitlines() or [""])


def _path(value: str | os.PathLike[str]) -> str:
    """A path as one argument of its own: a relative path starting with ``-`` gets ``./`` so no tool
    reads it as a flag."""
    text = os.fspath(value)
    return f"./{text}" if text.startswith("-") else text


def _trtexec_input(name: str) -> str:
    # trtexec splits a shape list on ',' before anything else, and takes quotes as the delimiters of
    # a name holding ':' ('input:0':1x3); a ',' or a quote in the name has no spelling.
    if "," in name or "'" in name:
        raise ConfigError(f"Input {name!r}: trtexec's --minShapes/--optShapes/--maxShapes cannot spell an "
                          "input name holding ',' or a single quote; rename the input in the model, or build "
                          "with Polygraphy.")
    return f"'{name}'" if ":" in name else name


def _trtexec_shapes(shapes: Mapping[str, ShapeRange], which: str) -> str:
    return ",".join(f"{_trtexec_input(name)}:{'x'.join(map(str, getattr(rng, which)))}"
                    for name, rng in shapes.items())


def _polygraphy_input(name: str) -> str:
    if name.startswith("-"):
        raise ConfigError(f"Input {name!r}: Polygraphy reads an argument starting with '-' as a flag, so its "
                          "shape options cannot name this input; rename the input in the model, or build "
                          "with trtexec.")
    return name


def _join(args: Sequence[str | os.PathLike[str]]) -> str:
    return " ".join(shlex.quote(os.fspath(a)) for a in args)


def _show(names: Sequence[str]) -> str:
    """Names for a comment: Python literals, so a line break inside a name stays ``\\n``."""
    return ", ".join(repr(name) for name in names)


def layer_precisions_problem(exclude: Sequence[str]) -> str | None:
    """Why trtexec's ``--layerPrecisions=NAME:PRECISION,...`` cannot pin ``exclude`` (None: it can).

    trtexec splits that list on ``,`` and each entry on ``:``, and takes quotes as name delimiters, so
    a node name holding any of them has no unambiguous spelling.
    """
    bad = [name for name in exclude if any(c in name for c in ",:'")]
    if not bad:
        return None
    more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
    return (f"trtexec's --layerPrecisions=NAME:PRECISION,... cannot spell node {bad[0]!r}{more}: it splits "
            "on ',' and ':' and takes quotes as delimiters")


def _weakly_typed(spec: EngineBuildSpec) -> list[str]:
    # INT8 and the excluded nodes' precision enabled (FP32 always is: trtexec has no --fp32 flag);
    # those nodes pinned to it by name.
    precision = spec.exclude_precision.value
    args = ["--int8", *([f"--{precision}"] if spec.exclude_precision is not Precision.FP32 else [])]
    if spec.exclude:
        problem = layer_precisions_problem(spec.exclude)
        if problem is not None:
            raise ConfigError(f"{problem}. Build strongly typed instead (the model's casts already keep "
                              "these nodes out of INT8), or rename the nodes.")
        layers = ",".join(f"{name}:{precision}" for name in spec.exclude)
        args += ["--precisionConstraints=obey", f"--layerPrecisions={layers}"]
    return args


def _pool_size(size: int, bare_unit: str) -> str:
    """A pool size as the tools read it: whole MiB as ``<n>M``, anything else in bytes (trtexec needs
    ``B``, Polygraphy reads a bare number as bytes)."""
    return f"{size // MIB}M" if size % MIB == 0 else f"{size}{bare_unit}"


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

    Raises:
        ConfigError: An input name (or, weakly typed, an excluded node's name) that trtexec's list
            syntax cannot spell; the message names it.
    """
    config = spec.config
    args: list[str] = ["trtexec", f"--onnx={spec.model}",
                       *(["--stronglyTyped"] if strongly_typed else _weakly_typed(spec))]
    if config.shapes:
        args += [f"--{which}Shapes={_trtexec_shapes(config.shapes, which)}"
                 for which in ("min", "opt", "max")]
    if config.save_engine is not None:
        args.append(f"--saveEngine={config.save_engine}")
    if config.timing_cache is not None:
        args.append(f"--timingCacheFile={config.timing_cache}")
    if config.workspace_bytes is not None:
        args.append(f"--memPoolSize=workspace:{_pool_size(config.workspace_bytes, 'B')}")
    if config.builder_optimization_level is not None:
        args.append(f"--builderOptimizationLevel={config.builder_optimization_level}")
    if not config.tf32:
        args.append("--noTF32")
    if spec.layer_info is not None:
        args += ["--profilingVerbosity=detailed", f"--exportLayerInfo={spec.layer_info}"]
    return _join(args)


def _polygraphy_common(spec: EngineBuildSpec) -> list[str]:
    config = spec.config
    args: list[str] = ["--strongly-typed"]
    for which in ("min", "opt", "max"):
        if config.shapes:
            args.append(f"--trt-{which}-shapes")
            args += [f"{_polygraphy_input(name)}:[{','.join(map(str, getattr(rng, which)))}]"
                     for name, rng in config.shapes.items()]
    if config.timing_cache is not None:
        cache = _path(config.timing_cache)
        args += ["--load-timing-cache", cache, "--save-timing-cache", cache]
    if config.workspace_bytes is not None:
        args += ["--pool-limit", f"workspace:{_pool_size(config.workspace_bytes, '')}"]
    if config.builder_optimization_level is not None:
        args += ["--builder-optimization-level", str(config.builder_optimization_level)]
    if config.tf32:
        args.append("--tf32")  # TensorRT's default, which Polygraphy turns off unless asked
    return args


def polygraphy_convert_command(spec: EngineBuildSpec) -> str:
    """The ``polygraphy convert`` command line equivalent to :func:`trtexec_command`.

    Args:
        spec: The build; ``spec.config.save_engine`` must be set (convert writes a file).

    Returns:
        A shell-quoted command.

    Raises:
        ConfigError: No engine path, or an input name Polygraphy's options cannot take.
    """
    engine = spec.config.save_engine
    if engine is None:
        raise ConfigError("polygraphy convert writes the engine to a file: set "
                          "EngineBuildSpec.config.save_engine.")
    args = ["polygraphy", "convert", _path(spec.model), "--convert-to", "trt", "-o", _path(engine)]
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

    Raises:
        ConfigError: An input name Polygraphy's options cannot take.
    """
    shapes = spec.config.shapes
    args = ["polygraphy", "run", _path(spec.model), "--trt", "--onnxrt", *_polygraphy_common(spec)]
    if shapes:
        args.append("--input-shapes")
        args += [f"{name}:[{','.join(map(str, rng.opt))}]" for name, rng in shapes.items()]
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

    Raises:
        ConfigError: A node name starts with ``-``: ModelOpt's option list would read it as a flag.
    """
    for name in exclude:
        if name.startswith("-"):
            raise ConfigError(f"Node {name!r}: ModelOpt's --nodes_to_exclude reads a name starting with '-' "
                              "as a flag; rename the node in the model.")
    args = ["python", "-m", "modelopt.onnx.quantization", "--onnx_path", _path(source),
            "--quantize_mode", "int8"]
    if calibration_data is not None:
        args += ["--calibration_data_path", _path(calibration_data)]
    if exclude:
        args += ["--nodes_to_exclude", *exclude]
    if output is not None:
        args += ["--output_path", _path(output)]
    return _join(args)


def build_commands(spec: EngineBuildSpec) -> BuildCommands:
    """Every command for ``spec``, plus a comment naming the excluded nodes.

    The weakly typed trtexec build and ModelOpt's command are left out (the comment says why) when
    their syntax cannot carry an excluded node's name; ModelOpt's also when ``spec.source`` is None.

    Args:
        spec: The build; ``spec.config.save_engine`` must be set.

    Returns:
        The commands.

    Raises:
        ConfigError: No engine path, or an input name neither tool can spell.
    """
    notes = []
    if spec.exclude:
        notes.append(f"# {len(spec.exclude)} node(s) kept in {spec.exclude_precision.value.upper()} "
                     f"(cast in the model; the strongly typed build follows it): {_show(spec.exclude)}")
    problem = layer_precisions_problem(spec.exclude)
    if problem is not None:
        notes.append(f"# No weakly typed trtexec build: {problem}.")
    weakly = "" if problem is not None else trtexec_command(spec, strongly_typed=False)
    modelopt = ""
    if spec.source is not None:
        try:
            modelopt = modelopt_command(spec.source, spec.exclude, calibration_data=spec.calibration_data,
                                        output=spec.model.with_name(f"{spec.model.stem}.modelopt.onnx"))
        except ConfigError:
            notes.append("# No ModelOpt command: its --nodes_to_exclude reads a node name starting with '-' "
                         "as a flag.")
    return BuildCommands(trtexec_command(spec), polygraphy_convert_command(spec),
                         polygraphy_run_command(spec), "\n".join(notes), weakly, modelopt)


__all__ = ["BuildCommands", "EngineBuildSpec", "as_comment", "build_commands", "data_extents",
           "layer_precisions_problem", "modelopt_command", "polygraphy_convert_command",
           "polygraphy_run_command", "trtexec_command"]
