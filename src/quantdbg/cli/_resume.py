"""The options of the commands that resume (``analyze``, ``fallback``, ``auto``): ``--restart`` and
``--evaluate-deps``.

A stopped run of these commands resumes from its journal when run again with the same inputs
(:mod:`quantdbg._journal`); ``--restart`` starts over instead, deleting the journal an earlier run
left. ``--evaluate-deps`` names the files an ``--evaluate`` command reads without naming them, so
a resumed run checks them too.
"""
from __future__ import annotations

import argparse
import os

from quantdbg import _journal

RESUMING = ("analyze", "auto", "fallback")
"""The subcommands that resume where a stopped run left off."""


def add_resume_options(parser: argparse.ArgumentParser, journal: str) -> None:
    """Adds ``--restart`` (``journal`` says where the journal is) and ``--evaluate-deps``."""
    parser.add_argument("--restart", action="store_true",
                        help=f"Start over: delete the journal a stopped run left ({journal}) instead of "
                             "resuming from it.")
    parser.add_argument("--evaluate-deps", nargs="+", default=[], metavar="FILE",
                        help="Files the --evaluate command reads without naming them (modules, configs): a "
                             "resumed run refuses to reuse scores made before one of them changed.")


def restart(args: argparse.Namespace, journal: str | os.PathLike) -> None:
    """With ``--restart``, deletes the journal at ``journal`` (only a quantdbg journal is deleted).

    Raises:
        FormatError: The file is not a quantdbg journal.
    """
    if args.restart:
        _journal.remove(journal)


__all__ = ["RESUMING", "add_resume_options", "restart"]
