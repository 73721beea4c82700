"""``quantdbg lint MODEL``: static check of a Q/DQ model's placement against TensorRT's fusion rules.

Exit status: 0 when no finding reaches ``--fail-on``; 1 when at least one does (so CI can gate on
it); 2 on bad input (unreadable model, unwritable ``--json`` path, unknown rule in ``--skip``).
"""
from __future__ import annotations

import argparse
import sys
import textwrap
from pathlib import Path

from quantdbg._io import commit_together, write_json_atomic, write_text_atomic
from quantdbg.cli._options import add_fail_on_option, add_model_argument
from quantdbg.cli._paths import claim_outputs
from quantdbg.cli.app import add_command
from quantdbg.diagnostics import RULES, LintReport, lint

_EPILOG = """\
exit status:
  0  no finding at or above --fail-on
  1  at least one finding at or above --fail-on
  2  bad input (the model does not load, --json cannot be written, unknown rule)

rules:
""" + "\n".join(f"  {rule.id:<26} {rule.severity.value:<8} {rule.title}" for rule in RULES.values())


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Adds the ``lint`` subcommand to ``sub``."""
    parser = add_command(
        sub, "lint", run,
        help="Flag Q/DQ placements TensorRT cannot fuse (why INT8 engines run slower than FP16).",
        description=__doc__.splitlines()[0].replace("``", "`"), epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_argument(parser, help="Q/DQ ONNX model (written by quantdbg, ONNX Runtime or ModelOpt).")
    parser.add_argument("--json", metavar="OUT.json", type=Path,
                        help="Also write the report as JSON (written atomically; the folder must exist).")
    add_fail_on_option(parser, default="high")
    parser.add_argument("--md", metavar="OUT.md",
                        help="Also write the report as Markdown (as doctor and report do); '-': print it "
                             "instead of the text.")
    parser.add_argument("--markdown", dest="md", action="store_const", const="-",
                        help="Print the Markdown report instead of the text (the same as --md -).")
    parser.add_argument("--skip", metavar="RULE", nargs="+", default=[], help="Rule ids to leave out.")


def run(args: argparse.Namespace) -> int:
    """Lints ``args.model``, prints the findings and returns the exit status.

    Args:
        args: Parsed arguments of the ``lint`` subcommand.

    Returns:
        0 or 1 (see the module docstring); input errors raise and become status 2 in ``cli.main``.
    """
    outputs = {"--json": args.json, "--md": args.md if args.md != "-" else None}
    with claim_outputs(args, outputs):
        report = lint(args.model, skip=args.skip)
        with commit_together(outputs) as staged:  # both files or neither
            if "--json" in staged:
                write_json_atomic(staged["--json"], report.to_dict())
            if "--md" in staged:
                write_text_atomic(staged["--md"], report.to_markdown())
    sys.stdout.write(report.to_markdown() if args.md == "-" else render_text(report))
    return 1 if report.fails(args.fail_on) else 0


def render_text(report: LintReport, width: int = 100) -> str:
    """Plain-text rendering: one block per finding, most severe first, then a count line."""
    lines = []
    indent = " " * 10
    for finding in report.findings:
        lines.append(f"{finding.severity.value.upper():<9} {finding.check}  [{finding.subjects[0]}]")
        lines.extend(textwrap.wrap(finding.title, width, initial_indent=indent, subsequent_indent=indent,
                                   break_on_hyphens=False))
        lines.extend(textwrap.wrap(f"fix: {finding.fix}", width, initial_indent=indent,
                                   subsequent_indent=indent + "     ", break_on_hyphens=False))
    total = len(report.findings)
    counts = ", ".join(f"{n} {severity}" for severity, n in report.counts().items())
    lines.append(f"{report.model or 'model'}: {total} finding{'s' if total != 1 else ''} ({counts})")
    return "\n".join(lines) + "\n"
