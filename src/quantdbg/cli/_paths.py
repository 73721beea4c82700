"""The one check every subcommand makes of its output paths before any work.

An output must not be an input (compared by file identity, so a symlink or ``./m.onnx`` is caught),
two outputs must differ, the folder must exist and be writable, and the path must not be a folder.
A failure is a ConfigError (one line, exit status 2) raised before anything is computed or written.
"""
from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from pathlib import Path

from quantdbg.errors import ConfigError

PathArg = str | os.PathLike | None


def check_paths(inputs: Mapping[str, PathArg], outputs: Mapping[str, PathArg]) -> None:
    """Fails when an output path would overwrite an input or another output, or cannot be written.

    Args:
        inputs: Option (or argument) name -> the path it names; None entries are skipped.
        outputs: Option name -> the path it will write; None entries are skipped.

    Raises:
        ConfigError: The first problem found, naming both options and saying how to fix it.
    """
    given_inputs = {flag: Path(p) for flag, p in inputs.items() if p is not None}
    seen: dict[str, Path] = {}
    for flag, value in outputs.items():
        if value is None:
            continue
        path = Path(value)
        _check_writable(flag, path)
        for in_flag, in_path in given_inputs.items():
            if _same(path, in_path):
                alias = "" if str(in_path) == str(path) else f" ({str(in_path)!r})"
                raise ConfigError(f"{flag} {str(path)!r} is the input {in_flag}{alias}; choose another "
                                  "output path (inputs are never overwritten).")
        for out_flag, out_path in seen.items():
            if _same(path, out_path):
                raise ConfigError(f"{flag} {str(path)!r} is also the {out_flag} output; give each output "
                                  "its own path.")
        seen[flag] = path


# Parsed-argument attributes that name files a subcommand reads, with the name the user knows them by.
_INPUTS = (("model", "MODEL"), ("result", "RESULT"), ("data", "--data"), ("eval", "--eval"),
           ("fp32", "--fp32"), ("report", "--report"))


def inputs_of(args: argparse.Namespace) -> dict[str, PathArg]:
    """The input files among a subcommand's parsed arguments (name shown to the user -> path)."""
    found = {label: getattr(args, attr, None) for attr, label in _INPUTS}
    return {label: path for label, path in found.items() if isinstance(path, (str, os.PathLike))}


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


def _same(a: Path, b: Path) -> bool:
    """True when ``a`` and ``b`` name one file: the same existing file, or the same resolved path."""
    try:
        if a.exists() and b.exists():
            return os.path.samefile(a, b)
    except OSError:
        pass
    return a.resolve() == b.resolve()
