"""The ``quantdbg`` command's parser and entry point: argparse subcommands, each a thin wrapper over
the Python API.

Each subcommand lives in its own module of this package and exposes ``register(subparsers)``,
which adds its parser and its ``func(args) -> int`` with :func:`add_command`.
"""
from __future__ import annotations

import argparse
import copy
import difflib
import importlib
import logging
import re
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from quantdbg._progress import close_bars
from quantdbg._version import __version__
from quantdbg.cli._options import add_common_options, hidden_spelling, log_level, resolve_model
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
        parser = _command_parser(self, found)
        if extras:
            parser.error(f"unrecognized arguments: {' '.join(extras)}{_flag_hint(parser, extras)}")
        problem = resolve_model(found)
        if problem is not None:
            parser.error(problem)
        return found

    def error(self, message: str) -> NoReturn:
        shown = _HIDDEN_IN_MESSAGE.sub("", message)  # "--data/--calibration_data_path" -> "--data"
        self.exit(2, f"{self.prog}: error: {shown}{_choice_hint(shown)} (see `{self.prog} --help`)\n")


_HIDDEN_IN_MESSAGE = re.compile(r"/--\w+_[\w-]*")
"""A hidden alias as argparse lists it after a flag's shown spellings (``-o/--out/--output_path``)."""


class _Formatter(argparse.HelpFormatter):
    """Leaves the hidden aliases (ModelOpt's underscore spellings) out of ``--help``."""

    def _format_action_invocation(self, action: argparse.Action) -> str:
        shown = copy.copy(action)
        shown.option_strings = [flag for flag in action.option_strings if not hidden_spelling(flag)]
        return super()._format_action_invocation(shown)


class _RawFormatter(_Formatter, argparse.RawDescriptionHelpFormatter):
    """:class:`_Formatter` keeping the description's and epilog's line breaks."""


def _command_parser(parser: argparse.ArgumentParser, found: argparse.Namespace) -> argparse.ArgumentParser:
    """The subcommand's parser when one was named (its flags are the ones to suggest), else ``parser``."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices.get(str(getattr(found, "command", "")), parser)
    return parser


# What users of trtexec type, answered with what quantdbg does instead (quantdbg has no such switch).
_TRTEXEC_HABITS = {
    "--int8": "quantdbg always writes explicit INT8 (Q/DQ) models; there is nothing to switch on",
    "--fp16": "the layers quantdbg keeps out of INT8 run in FP16 (--precision of fallback and auto, default "
              "fp16); name them with --exclude NODE, or let fallback / auto choose them",
    "--best": "quantdbg always writes explicit INT8 (Q/DQ) models, and the layers kept out of INT8 run in "
              "FP16; name them with --exclude NODE, or let fallback / auto choose them",
    "--saveEngine": "quantdbg builds no engine: it writes the ONNX model (--out), and fallback / auto put "
                    "the trtexec command that builds it in --plan",
}


def _flag_hint(parser: argparse.ArgumentParser, extras: Sequence[str]) -> str:
    """What to type instead of the first unknown flag: for trtexec's switches, what quantdbg does
    instead; else the closest known flag of the same kind (a switch for a switch, a flag taking a
    value for one given a value), e.g. `` ; did you mean --calibration-cache?``."""
    for i, extra in enumerate(extras):
        if not extra.startswith("-"):
            continue
        name, equals, _ = extra.partition("=")
        if name in _TRTEXEC_HABITS:
            return f"; {name} is trtexec's: {_TRTEXEC_HABITS[name]}"
        takes_value = bool(equals) or (i + 1 < len(extras) and not extras[i + 1].startswith("-"))
        flags = [flag for action in parser._actions if (action.nargs != 0) == takes_value
                 for flag in action.option_strings if flag.startswith("--")]
        near = difflib.get_close_matches(name, flags, n=1, cutoff=0.6)
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
    layout = texts.pop("formatter_class", argparse.HelpFormatter)
    raw = issubclass(layout, argparse.RawDescriptionHelpFormatter)
    parser = sub.add_parser(name, formatter_class=_RawFormatter if raw else _Formatter, **texts)
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
    """Runs the CLI. A QuantDbgError (or an OSError: a full disk, a read-only folder) closes the
    progress bars, prints one line on stderr and returns 2.

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
    except OSError as err:  # the machine, not the code: a full disk, a folder made read-only meanwhile
        close_bars()
        where = "".join(f"{str(name)!r}: " for name in (err.filename, err.filename2) if name is not None)
        sys.stderr.write(f"quantdbg {args.command}: error: {where}{err.strerror or err}.\n")
        return 2


if __name__ == "__main__":
    sys.exit(main())
