"""The ``quantdbg`` command (:mod:`~quantdbg.cli.app`), one module per subcommand."""
from quantdbg.cli.app import build_parser as build_parser
from quantdbg.cli.app import main as main

__all__ = ["build_parser", "main"]
