"""The ``quantdbg`` command: argparse subcommands, each a thin wrapper over the Python API.

Each subcommand lives in its own module of this package and exposes ``register(subparsers)``,
which adds its parser and its ``func(args) -> int`` with :func:`add_command`.
"""
from __future__ import annotations

import argparse
import difflib
import importlib
import logging
import re
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from quantdbg._progress import close_bars
from quantdbg._version import __version__
from quantdbg.cli._options import add_common_options, log_level
from quantdbg.cli._signals import Stopped, stop_on_signals
from quantdbg.cli._signals import message as stopped_message
from quantdbg.errors import QuantDbgError

# Modules of this package that define subcommands, in the order `--help` lists them.
_COMMAND_MODULES = ("calibrate", "analyze", "fallback", "auto", "apply", "lint", "report", "doctor", "demo")


class _Parser(argparse.ArgumentParser):
    """Reports a usage error in one line (not usage + error), exit status 2, like every bad input, and
    suggests the closest flag or choice for a typo."""

    def parse_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                   namespace: argparse.Namespace | None = None) -> argparse.Namespace:
        found, extras = self.parse_known_args(args, namespace)
        if extras:
            parser = _command_parser(self, found)
            parser.error(f"unrecognized arguments: {' '.join(extras)}{_flag_hint(parser, extras)}")
        return found

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}{_choice_hint(message)} (see `{self.prog} --help`)\n")


def _command_parser(parser: argparse.ArgumentParser, found: argparse.Namespace) -> argparse.ArgumentParser:
    """The subcommand's parser when one was named (its flags are the ones to suggest), else ``parser``."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices.get(str(getattr(found, "command", "")), parser)
    return parser


def _flag_hint(parser: argparse.ArgumentParser, extras: Sequence[str]) -> str:
    """`` (did you mean --calibration-cache?)`` for the first unknown flag close to a known one."""
    flags = [flag for action in parser._actions for flag in action.option_strings if flag.startswith("--")]
    for extra in extras:
        if extra.startswith("-"):
            near = difflib.get_close_matches(extra.partition("=")[0], flags, n=1, cutoff=0.6)
            if near:
                return f"; did you mean {near[0]}?"
    return ""


def _choice_hint(message: str) -> str:
    """``; did you mean 'sqnr'?`` for argparse's "invalid choice" message, when a choice is close."""
    match = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message)
    if match is None:
        return ""
    choices = re.findall(r"'([^']*)'", match.group(2))
    near = difflib.get_close_matches(match.group(1), choices, n=1, cutoff=0.5)
    return f"; did you mean {near[0]!r}?" if near else ""


def add_command(sub: argparse._SubParsersAction[argparse.ArgumentParser], name: str,
                run: Callable[[argparse.Namespace], int], **texts: Any) -> argparse.ArgumentParser:
    """Adds subcommand ``name`` to ``sub``, run by ``run(args) -> exit status``; ``texts`` are the
    parser's help, description and the like. Returns its parser, for the subcommand's options."""
    parser = sub.add_parser(name, **texts)
    parser.set_defaults(func=run)
    return parser


def build_parser() -> argparse.ArgumentParser:
    """Returns the parser with every subcommand registered (each with the common options)."""
    parser = _Parser(prog="quantdbg", description="INT8 post-training quantization of ONNX models for "
                     "TensorRT, and the tools to debug it.")
    parser.add_argument("--version", action="version", version=f"quantdbg {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="More log output (-vv: debug).")
    parser.add_argument("-q", "--quiet", action="count", default=0, help="Less log output (errors only).")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in _COMMAND_MODULES:
        importlib.import_module(f"quantdbg.cli.{name}").register(sub)
    for command in sub.choices.values():
        add_common_options(command)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the CLI. A QuantDbgError closes the progress bars, prints one line on stderr and returns 2.

    Args:
        argv: Arguments without the program name (None: ``sys.argv[1:]``).

    Returns:
        The process exit status.
    """
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=log_level(args), format="%(levelname)s %(name)s: %(message)s")
    try:
        with stop_on_signals():
            return int(args.func(args) or 0)
    except QuantDbgError as err:
        close_bars()  # the error gets a line of its own, not the tail of a bar
        sys.stderr.write(f"quantdbg {args.command}: error: {err}\n")
        return 2
    except Stopped as stop:  # SIGINT / SIGTERM: one line, status 130 / 143
        close_bars()
        sys.stderr.write(stopped_message(stop, args.command))
        return stop.status


if __name__ == "__main__":
    sys.exit(main())
