"""``quantdbg demo [--out DIR]``: ``quantdbg auto`` on the embedded digits CNN, with a short table;
``quantdbg demo --export DIR``: the model, data and evaluation script the README's commands use."""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import onnx

from quantdbg.cli._build import add_profile_option, profile_config
from quantdbg.cli._options import show_progress
from quantdbg.cli._paths import check_folder, claim_folder
from quantdbg.cli.app import add_command
from quantdbg.data import DEFAULT_BATCH_SIZE
from quantdbg.demo import DEMO_MIN_SQNR_DB, EXPORT_FILES, RUN_FILES, export_demo, load_embedded, run_demo
from quantdbg.errors import ConfigError
from quantdbg.model.specs import input_specs


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Adds the ``demo`` subcommand to ``sub``."""
    parser = add_command(
        sub, "demo", run,
        help="quantdbg auto on the embedded digits CNN, with a short table (offline).",
        description="The whole job on the digits CNN shipped inside quantdbg, as `quantdbg auto` does it: "
        "entropy calibration, the INT8 repairs, per-layer sensitivity, the FP16 fallback search, and an "
        "HTML/Markdown/JSON report, the models and the re-appliable result (plan.json).",
    )
    parser.add_argument(
        "-o",
        "--out",
        "--output",
        metavar="DIR",
        help="Folder for the report and models (created if missing; default: a new "
        "temporary folder, printed at the end).",
    )
    parser.add_argument(
        "--export",
        metavar="DIR",
        help="Only write the demo's files into DIR (created if missing) and stop: model.onnx (FP32), "
        "calib.npz and eval.npz (array 'input', eval.npz also 'labels'), and score.py (prints the top-1 "
        "accuracy of the model it is given), the files the README's commands use.",
    )
    parser.add_argument(
        "--min-sqnr",
        type=float,
        default=DEMO_MIN_SQNR_DB,
        metavar="DB",
        help=f"Target: logits SQNR against FP32 in dB (default {DEMO_MIN_SQNR_DB:g}).",
    )
    parser.add_argument(
        "--threads", type=int, default=0, metavar="N", help="ONNX Runtime threads (default 0: all cores)."
    )
    parser.add_argument(
        "--force", action="store_true", help="Replace the demo's files in DIR (without it, a DIR that holds "
        "any of them is refused)."
    )
    add_profile_option(parser)


def _folder(out: str | None) -> Path:
    """``--out``, created if missing, or a new temporary folder."""
    if out is None:
        return Path(tempfile.mkdtemp(prefix="quantdbg-demo-"))
    folder = Path(out)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ConfigError(f"Cannot create output folder {out!r}: {err}") from err
    return folder


def run(args: argparse.Namespace) -> int:
    """Runs ``quantdbg demo``.

    Returns:
        0 on success.

    Raises:
        QuantDbgError: The output folder cannot be created, or a bad setting.
    """
    if args.threads < 0:
        raise ConfigError(f"--threads must be >= 0, got {args.threads}.")
    if args.export is not None:
        if args.out is not None:
            raise ConfigError("--export only writes the demo's files; drop --out, or run the demo without "
                              "--export.")
        check_folder("--export", args.export)
        folder = _folder(args.export)
        with claim_folder("--export", folder, EXPORT_FILES, force=args.force):
            written = export_demo(folder)
        sys.stdout.write(f"wrote {', '.join(str(path) for path in written.values())}\n")
        return 0
    check_folder("--out", args.out)
    emb = load_embedded()
    engine = profile_config(args.profile, input_specs(onnx.load(str(emb.model_path))), DEFAULT_BATCH_SIZE)
    folder = _folder(args.out)
    with claim_folder("--out", folder, RUN_FILES, force=args.force):
        result = run_demo(folder, min_sqnr_db=args.min_sqnr, threads=args.threads,
                          progress=show_progress(args), engine=engine)
    sys.stdout.write(
        f"quantdbg demo: digits CNN (scikit-learn UCI digits), {result.n_calib_samples} "
        f"calibration / {result.n_eval_samples} evaluation images\n"
    )
    sys.stdout.write(result.summary_text())
    sys.stdout.write(
        f"report: {result.files['report.html']}\n(also report.md, report.json, the INT8 and final models, "
        f"plan.json with the build commands, and the files they read, in {folder}; {result.seconds:.1f} s)\n"
    )
    return 0
