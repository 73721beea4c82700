"""How an evaluation command travels to a cluster node that cannot see this machine's disk.

The files a :class:`~quantdbg.evaluation.CommandMetric` reads (its ``files()``: those it names and
its ``deps``) that lie under its working directory travel with it as one
:class:`~quantdbg.execution.shipping.Folder`, in their layout, and on another node the command runs
in that node's copy of the folder, an argument naming one of them by its absolute path rewritten to
name the copy. A file outside the working directory does not travel (the program, e.g.
``/usr/bin/python3``, is one): it must be installed at the same path on every node, which a worker
checks before its first run, refusing with one line that says how to ship the file instead.
"""
from __future__ import annotations

import os
import socket
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from quantdbg.errors import ConfigError
from quantdbg.evaluation.task import CommandMetric
from quantdbg.execution.shipping import Folder, Packer, local_path, register


def _ship(metric: CommandMetric, packer: Packer) -> tuple[object, ...]:
    base = metric._base()
    inside: dict[str, Path] = {}
    outside: list[str] = []
    for path in metric.files():
        if path.is_relative_to(base):
            inside[path.relative_to(base).as_posix()] = path
        else:
            outside.append(str(path))
    return _arrive, (dict(vars(metric)), packer.folder(inside, base), str(base), tuple(outside))


def _arrive(state: dict[str, Any], folder: Folder, base: str, outside: Sequence[str]) -> CommandMetric:
    """The command, run in this node's copy of its working directory (once its other files are found).

    Raises:
        ConfigError: A file outside the working directory is not on this node.
    """
    local = str(local_path(folder))
    for path in outside:
        if not os.path.isfile(path):
            raise ConfigError(f"Evaluation command {state['command']!r} reads {path!r}, which cluster node "
                              f"{socket.gethostname()!r} does not have: only files under the command's "
                              f"working directory {base!r} travel to the nodes; move it there and name it "
                              "relative to it (or install it at the same path on every node).")
    metric = CommandMetric.__new__(CommandMetric)  # checked on the driver already
    metric.__dict__.update(state, cwd=local, argv=[_relocate(arg, base, local) for arg in state["argv"]])
    return metric


def _relocate(arg: str, base: str, local: str) -> str:
    """``arg``, or the value of ``--opt=PATH``, naming a path under ``base`` by its absolute path: the
    same path under ``local``."""
    head, sep, tail = arg.partition("=")
    for prefix, path in (("", arg), (head + sep, tail if sep else "")):
        if path.startswith(base.rstrip(os.sep) + os.sep):
            return prefix + local + path[len(base.rstrip(os.sep)):]
    return arg


register(CommandMetric, _ship)

__all__: list[str] = []
