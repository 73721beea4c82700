"""How a TensorRT engine is built and loaded, and the optimization profile worked out from a model.

:class:`TrtConfig` is the one home of the build settings (profile, workspace in bytes, optimization
level, TF32, timing cache): the engine built here and the trtexec / Polygraphy commands of
:mod:`quantdbg.backends.tensorrt.commands` read the same object. Plain Python: everything here works
without TensorRT.
"""
from __future__ import annotations

import os
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

from quantdbg._json import Serializable
from quantdbg.errors import ConfigError, unknown
from quantdbg.model.specs import TensorSpec

MAX_OPT_LEVEL = 5
"""Highest ``builder_optimization_level`` TensorRT accepts."""


def _as_shape(value: Sequence[int], what: str) -> tuple[int, ...]:
    shape = tuple(int(d) for d in value)
    if any(d < 0 for d in shape):
        raise ConfigError(f"{what} {shape} has a negative dimension; give concrete sizes (>= 0).")
    return shape


@dataclass(frozen=True)
class ShapeRange(Serializable):
    """Min/opt/max shapes of one input in an optimization profile.

    Attributes:
        min: Smallest shape the engine accepts.
        opt: Shape TensorRT tunes its kernels for.
        max: Largest shape the engine accepts.
    """

    min: tuple[int, ...]
    opt: tuple[int, ...]
    max: tuple[int, ...]

    def __post_init__(self) -> None:
        shapes = [_as_shape(s, name) for s, name in ((self.min, "min"), (self.opt, "opt"), (self.max, "max"))]
        for name, shape in zip(("min", "opt", "max"), shapes, strict=True):
            object.__setattr__(self, name, shape)
        if len({len(s) for s in shapes}) != 1:
            raise ConfigError(f"ShapeRange ranks differ: min {self.min}, opt {self.opt}, max {self.max}.")
        if any(not lo <= mid <= hi for lo, mid, hi in zip(*shapes, strict=True)):
            raise ConfigError(f"ShapeRange needs min <= opt <= max on every axis, got min {self.min}, "
                              f"opt {self.opt}, max {self.max}.")


def optional_path(value: str | os.PathLike[str] | None) -> Path | None:
    """``Path(value)``, None staying None (for the optional path fields of frozen configs)."""
    return None if value is None else Path(value)


@dataclass(frozen=True)
class TrtConfig(Serializable):
    """How a TensorRT engine is built and loaded.

    Precision is not configured here: the network is strongly typed, so INT8 comes from the graph's
    Q/DQ pairs and FP16 from its casts.

    Attributes:
        batch: (min, opt, max) batch size of the optimization profile, used for every input whose
            only dynamic dimension is axis 0.
        shapes: Input name -> explicit :class:`ShapeRange`; needed for inputs with other dynamic
            dimensions (e.g. sequence length), and overrides ``batch``.
        workspace_bytes: Limit of TensorRT's workspace memory pool in bytes (None: TensorRT's default).
        builder_optimization_level: 0-5; higher builds longer and may run faster (None: TensorRT's
            default, 3).
        tf32: Allow TF32 for FP32 layers (TensorRT's default). False gives FP32-faithful float layers.
        timing_cache: Timing-cache file: read before the build when it exists, written after it.
        save_engine: Write the serialized engine here after building.
        load_engine: Deserialize this engine instead of building (the model still supplies the
            input specs that feeds are checked against).
    """

    batch: tuple[int, int, int] = (1, 8, 32)
    shapes: Mapping[str, ShapeRange] = field(default_factory=dict)
    workspace_bytes: int | None = None
    builder_optimization_level: int | None = None
    tf32: bool = True
    timing_cache: Path | None = None
    save_engine: Path | None = None
    load_engine: Path | None = None

    def __post_init__(self) -> None:
        batch = tuple(int(b) for b in self.batch)
        if len(batch) != 3 or not 1 <= batch[0] <= batch[1] <= batch[2]:
            raise ConfigError(f"batch must be (min, opt, max) with 1 <= min <= opt <= max, got {self.batch}.")
        object.__setattr__(self, "batch", batch)
        for name, value in self.shapes.items():
            if not isinstance(value, ShapeRange):
                raise ConfigError(f"shapes[{name!r}] must be a ShapeRange, got {type(value).__name__}.")
        object.__setattr__(self, "shapes", MappingProxyType(dict(self.shapes)))
        if self.workspace_bytes is not None and self.workspace_bytes <= 0:
            raise ConfigError(f"workspace_bytes must be > 0 or None, got {self.workspace_bytes}.")
        level = self.builder_optimization_level
        if level is not None and not 0 <= level <= MAX_OPT_LEVEL:
            raise ConfigError(f"builder_optimization_level must be in [0, {MAX_OPT_LEVEL}] or None, "
                              f"got {level}.")
        for name in ("timing_cache", "save_engine", "load_engine"):
            object.__setattr__(self, name, optional_path(getattr(self, name)))
        if self.save_engine is not None and self.load_engine is not None:
            raise ConfigError("save_engine and load_engine are both set: a loaded engine is not rebuilt, "
                              "so there is nothing new to save. Set one of them.")


def batch_profile(batch_size: int) -> tuple[int, int, int]:
    """The (min, opt, max) batch of every engine build quantdbg writes commands for: min 1, opt and
    max the batch size the model was calibrated and evaluated with (not the last, partial batch),
    so the engine takes any batch up to it. An input whose batch size is fixed keeps it.

    Raises:
        ConfigError: ``batch_size`` is below 1.
    """
    if batch_size < 1:
        raise ConfigError(f"The batch size must be >= 1, got {batch_size}.")
    return (1, batch_size, batch_size)


def resolve_profile(inputs: Mapping[str, TensorSpec], shapes: Mapping[str, ShapeRange],
                    batch: tuple[int, int, int],
                    seen: Mapping[str, ShapeRange] | None = None) -> dict[str, ShapeRange]:
    """Works out the optimization-profile range of every input that has a dynamic dimension.

    Args:
        inputs: The model's inputs (:func:`quantdbg.model.specs.input_specs`).
        shapes: Explicit ranges by input name; they win over ``batch``.
        batch: (min, opt, max) of every dynamic axis 0.
        seen: The smallest and largest shapes each input had in the data (e.g.
            :func:`quantdbg.backends.tensorrt.commands.data_extents`); they give the range of a
            dynamic axis other than 0 (a sequence length): min the smallest, opt and max the largest.

    Returns:
        Input name -> range, in input order, for inputs with explicit ranges or dynamic dimensions;
        fixed dimensions come from the model.

    Raises:
        ConfigError: An explicit range names no input, has the wrong rank or contradicts a fixed
            dimension, or an input has a dynamic dimension other than axis 0 that neither an explicit
            range nor ``seen`` covers.
    """
    for name in shapes:
        if name not in inputs:
            raise unknown("input", name, inputs, error=ConfigError)
    profile: dict[str, ShapeRange] = {}
    for name, spec in inputs.items():
        if name in shapes:
            profile[name] = _checked_range(spec, shapes[name])
        elif any(not isinstance(dim, int) or dim <= 0 for dim in spec.shape):
            profile[name] = _dynamic_range(spec, batch, (seen or {}).get(name))
    return profile


def _dynamic_range(spec: TensorSpec, batch: tuple[int, int, int], seen: ShapeRange | None) -> ShapeRange:
    """Axis 0 from ``batch``, other dynamic axes from the data's extents, fixed axes from the model."""
    dims: list[tuple[int, int, int]] = []
    for axis, dim in enumerate(spec.shape):
        if isinstance(dim, int) and dim > 0:
            dims.append((dim, dim, dim))
        elif axis == 0:
            dims.append(batch)
        elif seen is not None and len(seen.min) == len(spec.shape):
            dims.append((seen.min[axis], seen.max[axis], seen.max[axis]))
        else:
            dynamic = [i for i, d in enumerate(spec.shape) if not isinstance(d, int) or d <= 0]
            raise ConfigError(
                f"Input {spec.name!r} has shape {_show(spec.shape)} with dynamic axes {dynamic}; only a "
                f"dynamic batch (axis 0) is filled in from batch={batch}. Give its range explicitly, e.g. "
                f"shapes={{{spec.name!r}: ShapeRange(min=..., opt=..., max=...)}} (on the command line: "
                f"--profile {shlex.quote(spec.name + ':MIN,OPT,MAX')} with shapes like 1x16,8x128,32x128).")
    low, mid, high = zip(*dims, strict=True) if dims else ((), (), ())
    return ShapeRange(tuple(low), tuple(mid), tuple(high))


def _checked_range(spec: TensorSpec, rng: ShapeRange) -> ShapeRange:
    if len(rng.min) != len(spec.shape):
        raise ConfigError(f"The range for input {spec.name!r} has rank {len(rng.min)}, but the input has "
                          f"shape {_show(spec.shape)} (rank {len(spec.shape)}).")
    for axis, dim in enumerate(spec.shape):
        if isinstance(dim, int) and dim > 0 and not rng.min[axis] == rng.opt[axis] == rng.max[axis] == dim:
            raise ConfigError(f"The range for input {spec.name!r} sets axis {axis} to "
                              f"{rng.min[axis]}..{rng.max[axis]}, but that axis is fixed at {dim}.")
    return rng


def _show(shape: Sequence[int | str | None]) -> str:
    return "(" + ", ".join("?" if d is None else str(d) for d in shape) + ")"
