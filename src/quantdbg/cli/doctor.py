"""``quantdbg doctor MODEL --data CALIB.npz [--eval EVAL.npz] [--json OUT] [--html OUT] [--md OUT]``:
diagnose INT8 quantization problems and print the findings, most serious first, with their evidence."""

from __future__ import annotations

import argparse
import sys

from quantdbg.cli._options import (
    add_data_option,
    add_fail_on_option,
    add_method_option,
    add_model_argument,
    show_progress,
)
from quantdbg.cli._paths import claim_outputs
from quantdbg.cli.app import add_command
from quantdbg.config import CalibConfig
from quantdbg.diagnostics import CHECKS, DoctorConfig, diagnose
from quantdbg.report import render_markdown, write_report


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Adds the ``doctor`` subcommand to ``sub``."""
    parser = add_command(
        sub, "doctor", run_doctor,
        help="Diagnose INT8 quantization problems and print findings, most serious first.",
        description="Quantize MODEL and check for sensitive layers, weights zeroed by their range, "
        "calibrators that disagree, a calibration set too small, tensors mixing value ranges, and Q/DQ "
        "placements TensorRT cannot fuse. Findings are printed most serious first, with evidence.",
    )
    add_model_argument(parser, help="FP32 .onnx model (never modified).")
    add_data_option(parser, required=True,
                    help=".npz mapping each model input name to calibration samples (axis 0).")
    parser.add_argument("--eval", metavar="EVAL.npz",
                        help="Samples for the sensitivity checks (default: the calibration data).")
    parser.add_argument("--json", metavar="OUT.json", help="Also write the report as JSON.")
    parser.add_argument("--html", metavar="OUT.html", help="Also write the HTML report.")
    parser.add_argument("--md", metavar="OUT.md",
                        help="Also write the Markdown report ('-': print it instead of the text).")
    add_method_option(parser, metavar="METHOD",
                      help="Calibrator the model is examined with (default: entropy).")
    parser.add_argument("--checks", nargs="+", choices=CHECKS, metavar="CHECK",
                        help=f"Run only these checks ({', '.join(CHECKS)}).")
    parser.add_argument("--confirm-top", type=int, default=3, metavar="K",
                        help="Layers of the cheap ranking confirmed in isolation (default 3).")
    parser.add_argument("--batch-size", type=int, default=32, metavar="N",
                        help="Samples per batch (default 32).")
    add_fail_on_option(parser, default=None)


def run_doctor(args: argparse.Namespace) -> int:
    """Runs ``quantdbg doctor``.

    Returns:
        0, or 1 when ``--fail-on`` is given and a finding at that severity or worse exists.

    Raises:
        QuantDbgError: Bad input.
    """
    md_file = None if args.md == "-" else args.md
    with claim_outputs(args, {"--json": args.json, "--html": args.html, "--md": md_file}):
        return _doctor(args, md_file)


def _doctor(args: argparse.Namespace, md_file: str | None) -> int:
    config = DoctorConfig(
        CalibConfig(method=args.method),
        checks=tuple(args.checks) if args.checks else CHECKS,
        batch_size=args.batch_size,
        confirm_top=args.confirm_top,
    )
    report = diagnose(args.model, args.data, args.eval, config, progress=show_progress(args))
    sys.stdout.write(render_markdown(report) if args.md == "-" else report.to_text())
    if args.json or args.html or md_file:
        written = write_report(report, html=args.html, markdown=md_file, json=args.json)
        paths = [str(p) for p in (written.json, written.html, written.markdown) if p is not None]
        sys.stdout.write(f"wrote {', '.join(paths)}\n")
    return 1 if args.fail_on is not None and report.fails(args.fail_on) else 0
