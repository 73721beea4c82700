"""What the subcommands that write a model TensorRT builds share (fallback, auto, apply, demo): the
``--profile`` option and the printed build commands.

``--profile`` sets the TensorRT optimization profile of the build commands.

Without it every command follows one rule (:func:`quantdbg.backends.tensorrt.config.batch_profile`): a
dynamic batch gets min 1, opt and max the ``--batch-size`` the model was calibrated and evaluated
with. ``--profile MIN,OPT,MAX`` sets that batch range for every input; ``--profile INPUT:MIN,OPT,MAX``
(repeatable) sets one input's, each of MIN/OPT/MAX a batch size or a whole shape (``1x16,8x128,32x128``
for an input with a dynamic sequence length too).
"""
from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence

from quantdbg.backends.tensorrt import BuildCommands, ShapeRange, TrtConfig
from quantdbg.backends.tensorrt.config import batch_profile, resolve_profile
from quantdbg.errors import ConfigError, unknown
from quantdbg.model.specs import TensorSpec

_FORM = "--profile MIN,OPT,MAX or --profile INPUT:MIN,OPT,MAX"


def add_profile_option(parser: argparse.ArgumentParser) -> None:
    """Adds ``--profile [INPUT:]MIN,OPT,MAX`` (repeatable)."""
    parser.add_argument("--profile", action="append", default=[], metavar="[INPUT:]MIN,OPT,MAX",
                        help="TensorRT optimization profile of the build commands: the batch range of every "
                             "input, or INPUT's (a batch size or a shape like 8x128 each; repeatable). "
                             "Default: min 1, opt and max --batch-size.")


def profile_config(entries: Sequence[str], inputs: Mapping[str, TensorSpec],
                   batch_size: int) -> TrtConfig | None:
    """The build settings ``--profile`` asks for (None when not given: the library's rule applies).

    Args:
        entries: The ``--profile`` values.
        inputs: The model's inputs.
        batch_size: ``--batch-size``, the batch range of inputs no entry names.

    Raises:
        ConfigError: A malformed entry, an unknown input (closest names suggested), an input given
            twice, or a range TensorRT would refuse (min <= opt <= max, fixed dimensions kept).
    """
    if not entries:
        return None
    batch: tuple[int, int, int] | None = None
    shapes: dict[str, ShapeRange] = {}
    for entry in entries:
        name, sep, values = entry.rpartition(":")
        triple = _triple(entry, values)
        if not sep:
            if batch is not None:
                raise ConfigError(f"--profile {entry!r}: the batch range of every input is given twice; give "
                                  "it once (INPUT:MIN,OPT,MAX sets one input's).")
            batch = _batch(entry, triple)
            continue
        if name not in inputs:
            raise ConfigError(f"--profile {entry!r}: {unknown('input', name, inputs)}")
        if name in shapes:
            raise ConfigError(f"--profile {entry!r}: input {name!r} is given twice; give it once.")
        shapes[name] = _input_range(entry, inputs[name], triple)
    return TrtConfig(batch=batch or batch_profile(batch_size), shapes=shapes)


def _triple(entry: str, values: str) -> tuple[tuple[int, ...], ...]:
    parts = values.split(",")
    try:
        triple = tuple(tuple(int(d) for d in part.split("x")) for part in parts)
    except ValueError:
        triple = ()
    if len(triple) != 3:
        raise ConfigError(f"--profile {entry!r}: expected {_FORM}, each of MIN, OPT, MAX a batch size (8) "
                          "or a shape (8x128).")
    return triple


def _batch(entry: str, triple: tuple[tuple[int, ...], ...]) -> tuple[int, int, int]:
    if any(len(part) != 1 for part in triple):
        raise ConfigError(f"--profile {entry!r}: shapes need the input they belong to, INPUT:MIN,OPT,MAX.")
    low, mid, high = (part[0] for part in triple)
    if not 1 <= low <= mid <= high:
        raise ConfigError(f"--profile {entry!r}: the batch range needs 1 <= MIN <= OPT <= MAX.")
    return low, mid, high


def _input_range(entry: str, spec: TensorSpec, triple: tuple[tuple[int, ...], ...]) -> ShapeRange:
    """An input's range: whole shapes as given, batch sizes on axis 0 with the other axes from the model."""
    try:
        if all(len(part) == 1 for part in triple) and len(spec.shape) != 1:
            found = resolve_profile({spec.name: spec}, {}, _batch(entry, triple))
            if spec.name not in found:
                raise ConfigError(f"input {spec.name!r} has the fixed shape {tuple(spec.shape)}; it needs no "
                                  "profile")
            return found[spec.name]
        return resolve_profile({spec.name: spec}, {spec.name: ShapeRange(*triple)}, (1, 1, 1))[spec.name]
    except ConfigError as err:
        raise ConfigError(f"--profile {entry!r}: {err}") from err


def print_commands(commands: BuildCommands) -> None:
    """Prints every build command after a line saying what it does."""
    for what, command in commands.lines():
        sys.stdout.write(f"{what}:\n  {command}\n")
