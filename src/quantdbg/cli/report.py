"""``quantdbg report RESULT.json --html OUT.html [--md OUT.md]``: render any result JSON quantdbg wrote."""

from __future__ import annotations

import argparse
import sys

from quantdbg.cli._paths import claim_outputs
from quantdbg.cli.app import add_command
from quantdbg.errors import ConfigError
from quantdbg.report import load_result, render_markdown, write_report


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Adds the ``report`` subcommand to ``sub``."""
    parser = add_command(
        sub, "report", run_report,
        help="Render a result JSON as a self-contained HTML and/or Markdown report.",
        description="Render any result quantdbg wrote (calibration, `calibrate --scales`, `analyze --out`, "
        "`fallback --plan`, `lint --json`, `doctor --json`, `auto --plan`, `demo`'s report.json) as HTML "
        "with embedded plots and/or Markdown.",
    )
    parser.add_argument("result", metavar="RESULT.json", help="A result JSON written by quantdbg.")
    parser.add_argument("--html", metavar="OUT.html", help="Write the HTML report here.")
    parser.add_argument("--md", metavar="OUT.md", help="Write the Markdown report here ('-': print it).")
    parser.add_argument("--title", help="Report title (default: from the result).")
    parser.add_argument(
        "--no-plots", action="store_true", help="Leave the plots out of the HTML (no matplotlib needed)."
    )


def run_report(args: argparse.Namespace) -> int:
    """Runs ``quantdbg report``.

    Returns:
        0 on success.

    Raises:
        QuantDbgError: Unreadable result, no output requested, missing folder or dependency.
    """
    if args.html is None and args.md is None:
        raise ConfigError("Nothing to write: give --html OUT.html and/or --md OUT.md (--md -: print it).")
    md_file = None if args.md == "-" else args.md
    with claim_outputs(args, {"--html": args.html, "--md": md_file}):
        return _report(args, md_file)


def _report(args: argparse.Namespace, md_file: str | None) -> int:
    result = load_result(args.result)
    if args.md == "-":
        sys.stdout.write(render_markdown(result, title=args.title))
    if args.html is None and md_file is None:
        return 0
    written = write_report(
        result, html=args.html, markdown=md_file, title=args.title, plots=not args.no_plots
    )
    paths = [str(p) for p in (written.html, written.markdown) if p is not None]
    sys.stdout.write(f"wrote {', '.join(paths)}\n")
    return 0
