"""The one check every subcommand makes of its output paths before any work, and the lock it holds
on them while it runs.

The inputs are every file the command reads: the files its options name, the external data files
of each model among them (found from the graph, without reading weights) and the existing files
named in its ``--evaluate`` command. The outputs are every file it writes, a model's data file
(``OUT.onnx.data``) included. An output must not be an input (compared by file identity, so a
symlink or ``./m.onnx`` is caught), two outputs must differ, the folder must exist and be
writable, and the path must not be a folder. A failure is a ConfigError (one line, exit status 2)
raised before anything is computed or written. While the command runs it holds an advisory lock
on each output, so a second run writing one of them is refused instead of mixing its files in.
"""
from __future__ import annotations

import argparse
import contextlib
import os
from collections.abc import Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from quantdbg._io import output_lock, same_file
from quantdbg.errors import ConfigError
from quantdbg.evaluation import CommandMetric
from quantdbg.model.load import data_files_of
from quantdbg.model.save import data_path

PathArg = str | os.PathLike | None

_NEVER = "choose another output path (inputs are never overwritten)."


@dataclass(frozen=True)
class _File:
    """One file a command reads or writes.

    Attributes:
        flag: The option (or argument) the user named it with.
        path: The file.
        part: ``"file"``: the file the option names; ``"data"``: the external data file of the
            model ``owner`` the option names; ``"command"``: a file the command of the option names.
        owner: The model a data file belongs to.
    """

    flag: str
    path: Path
    part: Literal["file", "data", "command"] = "file"
    owner: Path | None = None

    def as_output(self) -> str:
        """How an output starts the message that refuses it."""
        if self.part == "data":
            return f"{self.flag} {str(self.owner)!r} may write its weights to {str(self.path)!r}, which"
        return f"{self.flag} {str(self.path)!r}"

    def as_input(self, output: Path) -> str:
        """What this input is, said to the user (``output``: the path that collides with it)."""
        if self.part == "data":
            return f"the external data file of the input {self.flag} {str(self.owner)!r}"
        if self.part == "command":
            return f"a file the {self.flag} command reads"
        alias = "" if str(self.path) == str(output) else f" ({str(self.path)!r})"
        return f"the input {self.flag}{alias}"

    def as_other_output(self) -> str:
        """What this output is, said when another output collides with it."""
        if self.part == "data":
            return f"where the {self.flag} output {str(self.owner)!r} may write its weights"
        return f"the {self.flag} output"


# Parsed-argument attributes that name files a subcommand reads, with the name the user knows them by.
_INPUTS = (("model", "MODEL"), ("result", "RESULT"), ("data", "--data"), ("eval", "--eval"),
           ("fp32", "--fp32"), ("report", "--report"))
_MODELS = frozenset({"model", "fp32"})
"""The attributes among them that name ONNX models (whose external data files are inputs too)."""


def inputs_of(args: argparse.Namespace) -> list[_File]:
    """Every file a subcommand's parsed arguments make it read: the files named, the data files of
    the models among them, the existing files its ``--evaluate`` command names and the
    ``--evaluate-deps`` it lists.

    Raises:
        ConfigError: The ``--evaluate`` command cannot be parsed or names no ``{model}``, or a
            dependency is not an existing file.
    """
    found = []
    for attr, flag in _INPUTS:
        path = getattr(args, attr, None)
        if isinstance(path, (str, os.PathLike)):
            found.append(_File(flag, Path(path)))
            if attr in _MODELS:
                found += [_File(flag, data, "data", Path(path)) for data in data_files_of(path)]
    command = getattr(args, "evaluate", None)
    if isinstance(command, str):
        deps = getattr(args, "evaluate_deps", None) or ()
        found += [_File("--evaluate", path, "command") for path in CommandMetric(command, deps=deps).files()]
    return found


def outputs_of(outputs: Mapping[str, PathArg], models: Collection[str] = ()) -> list[_File]:
    """The files ``outputs`` (option -> path; None: not written) write, with the data file beside
    each model output named in ``models`` (the path :func:`~quantdbg.model.save_model` uses)."""
    found = []
    for flag, value in outputs.items():
        if value is not None:
            found.append(_File(flag, Path(value)))
            if flag in models:
                found.append(_File(flag, data_path(value), "data", Path(value)))
    return found


def check_paths(inputs: Iterable[_File], outputs: Iterable[_File]) -> None:
    """Fails when an output would overwrite an input or another output, or cannot be written.

    Args:
        inputs: What the command reads (:func:`inputs_of`).
        outputs: What it writes (:func:`outputs_of`).

    Raises:
        ConfigError: The first problem found, naming both files and saying how to fix it.
    """
    given = list(inputs)
    seen: list[_File] = []
    for out in outputs:
        if out.part == "file":
            _check_writable(out.flag, out.path)
        for read in given:
            if same_file(out.path, read.path):
                raise ConfigError(f"{out.as_output()} is {read.as_input(out.path)}; {_NEVER}")
        for other in seen:
            if same_file(out.path, other.path):
                raise ConfigError(f"{out.as_output()} is also {other.as_other_output()}; give each output "
                                  "its own path.")
        seen.append(out)


@contextlib.contextmanager
def claim_outputs(args: argparse.Namespace, outputs: Mapping[str, PathArg], models: Collection[str] = (),
                  inputs: Mapping[str, PathArg] | None = None) -> Iterator[None]:
    """Checks ``outputs`` against every input of ``args`` and each other (:func:`check_paths`), then
    holds a lock on each while the block runs (another run writing one of them is refused).

    Args:
        args: The subcommand's parsed arguments (its inputs are read from them).
        outputs: Option -> path it writes (None: not written), in the order the user thinks of them.
        models: The options among ``outputs`` that write ONNX models (each may write a data file).
        inputs: Other files the subcommand reads (argument -> path), e.g. ``apply``'s PLAN.

    Raises:
        ConfigError: An output collides with an input or another output, cannot be written, or
            another run holds its lock.
    """
    files = outputs_of(outputs, models)
    extra = [_File(flag, Path(path)) for flag, path in (inputs or {}).items() if path is not None]
    check_paths([*extra, *inputs_of(args)], files)
    with contextlib.ExitStack() as locks:
        for out in files:
            if out.part == "file":
                locks.enter_context(output_lock(out.path, f"{out.flag} {str(out.path)!r}"))
        yield


@contextlib.contextmanager
def claim_folder(flag: str, folder: Path, names: Iterable[str], *, force: bool) -> Iterator[None]:
    """Refuses to replace the files ``names`` in the existing output folder ``folder`` unless
    ``force``, then holds a lock on each while the block runs (another run writing one is refused).

    Raises:
        ConfigError: The folder holds some of ``names`` and ``force`` is False, or another run holds
            a lock.
    """
    paths = [folder / name for name in names]
    found = [path.name for path in paths if os.path.lexists(path)]
    if found and not force:
        raise ConfigError(f"{flag} {str(folder)!r} already holds {', '.join(found)}; add --force to replace "
                          f"{'it' if len(found) == 1 else 'them'}, or choose another folder.")
    with contextlib.ExitStack() as locks:
        for path in paths:
            locks.enter_context(output_lock(path, f"{flag} {str(path)!r}"))
        yield


def check_folder(flag: str, folder: PathArg) -> None:
    """Fails when output folder ``folder`` exists as a file or cannot be written (None: skipped).

    Raises:
        ConfigError: The path is a file, or an existing folder is not writable.
    """
    if folder is None:
        return
    path = Path(folder)
    if path.exists() and not path.is_dir():
        raise ConfigError(f"{flag} {str(path)!r} is a file, not a folder; give a folder path.")
    if path.is_dir() and not os.access(path, os.W_OK | os.X_OK):
        raise ConfigError(f"{flag} {str(path)!r}: folder is not writable; choose another folder.")


def _check_writable(flag: str, path: Path) -> None:
    if path.is_dir():
        raise ConfigError(f"{flag} {str(path)!r} is a folder; give a file path inside it.")
    folder = path.resolve().parent
    if not folder.is_dir():
        raise ConfigError(f"{flag} {str(path)!r}: folder {str(folder)!r} does not exist.")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ConfigError(f"{flag} {str(path)!r}: folder {str(folder)!r} is not writable; choose "
                          "another folder.")
