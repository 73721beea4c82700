"""``quantdbg report``, ``quantdbg doctor`` and ``quantdbg demo``: reading results.

* ``report RESULT.json --html OUT.html [--md OUT.md]`` renders any result JSON quantdbg wrote;
* ``doctor MODEL --data CALIB.npz [--eval EVAL.npz] [--json OUT] [--html OUT]`` prints findings,
  most serious first, with their evidence;
* ``demo [--out DIR]`` runs the whole job on the embedded digits CNN and prints a short table.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from quantdbg.errors import ConfigError

_FAIL_LEVELS = ("high", "medium", "low", "info")


def register(sub: argparse._SubParsersAction) -> None:
    """Adds the ``report``, ``doctor`` and ``demo`` subcommands to ``sub``."""
    _register_report(sub)
    _register_doctor(sub)
    _register_demo(sub)


def _check_outputs(*paths: str | None) -> None:
    """Fails before any work when an output's folder does not exist."""
    for path in paths:
        if path is not None and not Path(path).resolve().parent.is_dir():
            raise ConfigError(
                f"Cannot write {path!r}: folder {str(Path(path).resolve().parent)!r} does not exist."
            )


# --------------------------------------------------------------------------------------------
# report
# --------------------------------------------------------------------------------------------


def _register_report(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "report",
        help="Render a result JSON as a self-contained HTML and/or Markdown report.",
        description="Render any result quantdbg wrote (calibration, `analyze --out`, `fallback --plan`, "
        "lint, `doctor --json`, `demo`'s report.json) as HTML with embedded plots and/or Markdown.",
    )
    parser.add_argument("result", metavar="RESULT.json", help="A result JSON written by quantdbg.")
    parser.add_argument("--html", metavar="OUT.html", help="Write the HTML report here.")
    parser.add_argument("--md", metavar="OUT.md", help="Write the Markdown report here.")
    parser.add_argument("--title", help="Report title (default: from the result).")
    parser.add_argument(
        "--no-plots", action="store_true", help="Leave the plots out of the HTML (no matplotlib needed)."
    )
    parser.set_defaults(func=run_report)


def run_report(args: argparse.Namespace) -> int:
    """Runs ``quantdbg report``.

    Returns:
        0 on success.

    Raises:
        QuantDbgError: Unreadable result, no output requested, missing folder or dependency.
    """
    from quantdbg.report import load_result, write_report

    if args.html is None and args.md is None:
        raise ConfigError("Nothing to write: give --html OUT.html and/or --md OUT.md.")
    _check_outputs(args.html, args.md)
    result = load_result(args.result)
    written = write_report(
        result, html=args.html, markdown=args.md, title=args.title, plots=not args.no_plots
    )
    paths = [str(p) for p in (written.html, written.markdown) if p is not None]
    sys.stdout.write(f"wrote {', '.join(paths)}\n")
    return 0


# --------------------------------------------------------------------------------------------
# doctor
# --------------------------------------------------------------------------------------------


def _register_doctor(sub: argparse._SubParsersAction) -> None:
    from quantdbg.diagnostics import CHECKS

    parser = sub.add_parser(
        "doctor",
        help="Diagnose INT8 quantization problems and print findings, most serious first.",
        description="Quantize MODEL and check for sensitive layers, weights zeroed by their range, "
        "calibrators that disagree, a calibration set too small, tensors mixing value ranges, and Q/DQ "
        "placements TensorRT cannot fuse. Findings are printed most serious first, with evidence.",
    )
    parser.add_argument("model", metavar="MODEL", help="FP32 .onnx model (never modified).")
    parser.add_argument(
        "--data",
        required=True,
        metavar="CALIB.npz",
        help=".npz mapping each model input name to calibration samples (axis 0).",
    )
    parser.add_argument(
        "--eval",
        metavar="EVAL.npz",
        help="Samples for the sensitivity checks (default: the calibration data).",
    )
    parser.add_argument("--json", metavar="OUT.json", help="Also write the report as JSON.")
    parser.add_argument("--html", metavar="OUT.html", help="Also write the HTML report.")
    parser.add_argument("--md", metavar="OUT.md", help="Also write the Markdown report.")
    parser.add_argument(
        "--method",
        default="entropy",
        metavar="METHOD",
        help="Calibrator the model is examined with (default: entropy).",
    )
    parser.add_argument(
        "--checks",
        nargs="+",
        choices=CHECKS,
        metavar="CHECK",
        help=f"Run only these checks ({', '.join(CHECKS)}).",
    )
    parser.add_argument(
        "--confirm-top",
        type=int,
        default=3,
        metavar="K",
        help="Layers of the cheap ranking confirmed in isolation (default 3).",
    )
    parser.add_argument(
        "--batch-size", type=int, default=32, metavar="N", help="Samples per batch (default 32)."
    )
    parser.add_argument(
        "--fail-on",
        choices=_FAIL_LEVELS,
        help="Exit with status 1 when a finding of this severity or worse exists (for CI).",
    )
    parser.add_argument("--no-progress", action="store_true", help="Do not draw progress bars.")
    parser.set_defaults(func=run_doctor)


def run_doctor(args: argparse.Namespace) -> int:
    """Runs ``quantdbg doctor``.

    Returns:
        0, or 1 when ``--fail-on`` is given and a finding at that severity or worse exists.

    Raises:
        QuantDbgError: Bad input.
    """
    from quantdbg.config import CalibConfig
    from quantdbg.diagnostics import CHECKS, DoctorConfig, diagnose
    from quantdbg.report import write_report

    _check_outputs(args.json, args.html, args.md)
    config = DoctorConfig(
        CalibConfig(method=args.method),
        checks=tuple(args.checks) if args.checks else CHECKS,
        batch_size=args.batch_size,
        confirm_top=args.confirm_top,
    )
    report = diagnose(args.model, args.data, args.eval, config, progress=not args.no_progress)
    sys.stdout.write(report.to_text())
    if args.json or args.html or args.md:
        written = write_report(report, html=args.html, markdown=args.md, json=args.json)
        paths = [str(p) for p in (written.json, written.html, written.markdown) if p is not None]
        sys.stdout.write(f"wrote {', '.join(paths)}\n")
    if args.fail_on is not None:
        worst = _FAIL_LEVELS.index(args.fail_on)
        if any(_FAIL_LEVELS.index(f.severity) <= worst for f in report.findings):
            return 1
    return 0


# --------------------------------------------------------------------------------------------
# demo
# --------------------------------------------------------------------------------------------


def _register_demo(sub: argparse._SubParsersAction) -> None:
    from quantdbg.demo import DEMO_MIN_SQNR_DB

    parser = sub.add_parser(
        "demo",
        help="Calibrate, analyze, fall back and report on the embedded digits CNN (offline).",
        description="The whole job on the digits CNN shipped inside quantdbg: entropy calibration, per-layer "
        "sensitivity, FP16 fallback search, doctor, and an HTML/Markdown/JSON report.",
    )
    parser.add_argument(
        "--out",
        metavar="DIR",
        help="Folder for the report and models (created if missing; default: a new "
        "temporary folder, printed at the end).",
    )
    parser.add_argument(
        "--min-sqnr",
        type=float,
        default=DEMO_MIN_SQNR_DB,
        metavar="DB",
        help=f"Fallback target: logits SQNR against FP32 in dB (default {DEMO_MIN_SQNR_DB:g}).",
    )
    parser.add_argument(
        "--threads", type=int, default=0, metavar="N", help="ONNX Runtime threads (default 0: all cores)."
    )
    parser.add_argument("--no-progress", action="store_true", help="Do not draw progress bars.")
    parser.set_defaults(func=run_demo)


def run_demo(args: argparse.Namespace) -> int:
    """Runs ``quantdbg demo``.

    Returns:
        0 on success.

    Raises:
        QuantDbgError: The output folder cannot be created, or a bad setting.
    """
    from quantdbg.demo import run_demo as demo

    if args.threads < 0:
        raise ConfigError(f"--threads must be >= 0, got {args.threads}.")
    if args.out is None:
        folder = Path(tempfile.mkdtemp(prefix="quantdbg-demo-"))
    else:
        folder = Path(args.out)
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise ConfigError(f"Cannot create output folder {args.out!r}: {err}") from err
    result = demo(folder, min_sqnr_db=args.min_sqnr, threads=args.threads, progress=not args.no_progress)
    sys.stdout.write(
        f"quantdbg demo: digits CNN (scikit-learn UCI digits), {result.n_calib_samples} "
        f"calibration / {result.n_eval_samples} evaluation images\n"
    )
    sys.stdout.write(result.summary_text())
    sys.stdout.write(
        f"report: {result.files['report.html']}\n(also report.md, report.json, the INT8 and "
        f"mixed models and fallback_plan.json in {folder}; {result.seconds:.1f} s)\n"
    )
    return 0
