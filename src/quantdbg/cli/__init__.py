"""The ``quantdbg`` command: argparse subcommands, each a thin wrapper over the Python API.

Each subcommand lives in its own module of this package and exposes ``register(subparsers)``,
which adds its parser and sets ``func(args) -> int``.
"""
from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence
from typing import NoReturn

from quantdbg.cli._signals import Stopped, stop_on_signals
from quantdbg.cli._signals import message as stopped_message
from quantdbg.errors import QuantDbgError

# Modules of this package that define subcommands, in the order `--help` lists them.
_COMMAND_MODULES = ("calibrate", "analyze", "fallback", "auto", "lint", "report", "doctor", "demo")


class _Parser(argparse.ArgumentParser):
    """Reports a usage error in one line (not usage + error), exit status 2, like every bad input."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


def build_parser() -> argparse.ArgumentParser:
    """Returns the parser with every subcommand registered."""
    parser = _Parser(prog="quantdbg", description="INT8 post-training quantization of ONNX models for "
                     "TensorRT, and the tools to debug it.")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="More log output (-vv: debug).")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in _COMMAND_MODULES:
        importlib.import_module(f"quantdbg.cli.{name}").register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the CLI. A QuantDbgError prints one line on stderr and returns 2.

    Args:
        argv: Arguments without the program name (None: ``sys.argv[1:]``).

    Returns:
        The process exit status.
    """
    args = build_parser().parse_args(argv)
    level = logging.WARNING - 10 * min(args.verbose, 2)
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    try:
        with stop_on_signals():
            return int(args.func(args) or 0)
    except QuantDbgError as err:
        sys.stderr.write(f"quantdbg {args.command}: error: {err}\n")
        return 2
    except Stopped as stop:  # SIGINT / SIGTERM: one line, status 130 / 143
        sys.stderr.write(stopped_message(stop, args.command))
        return stop.status


if __name__ == "__main__":
    sys.exit(main())
