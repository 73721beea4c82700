"""``quantdbg analyze``: rank the quantized layers of a model by sensitivity (per ONNX node name).

MODEL is an FP32 model (quantized here from ``--data`` with ``--method``) or a Q/DQ model made
elsewhere, whose FP32 original is given with ``--fp32``. ``--evaluate 'CMD {model}'`` makes a
command's last printed line the task metric. A stopped sweep resumes from ``RESULT.json.partial``
(``--restart`` starts over).
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from quantdbg.cli._options import add_model_options, add_out_option, executor, load_inputs, show_progress
from quantdbg.cli._paths import claim_outputs
from quantdbg.cli._resume import add_resume_options, restart
from quantdbg.cli.app import add_command
from quantdbg.errors import ConfigError
from quantdbg.sensitivity import SensitivityConfig, analyze_sensitivity
from quantdbg.sensitivity.config import MODES


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Adds the ``analyze`` subcommand to ``sub``."""
    analyze = add_command(sub, "analyze", run_analyze,
                          help="Rank quantized layers by sensitivity (per ONNX node name).",
                          description="Rank the quantized layers of MODEL by how much INT8 hurts them.")
    add_model_options(analyze)
    analyze.add_argument("--mode", choices=MODES, default="local",
                         help="local (cheap, one pass), cumulative, isolated or leave-one-out "
                              "(default local).")
    analyze.add_argument("--jobs", type=int, default=1, help="Processes for isolated / leave-one-out.")
    analyze.add_argument("--no-evidence", action="store_true", help="Skip the weight/activation evidence.")
    add_out_option(analyze, metavar="RESULT.json", help="Where the report goes.")
    add_resume_options(analyze, "RESULT.json.partial")


def run_analyze(args: argparse.Namespace) -> int:
    """``quantdbg analyze``: writes the sensitivity report and prints the top of the ranking.

    Returns:
        0 on success.

    Raises:
        QuantDbgError: Bad input (the CLI prints it as one line and exits 2).
    """
    partial = Path(f"{args.out}.partial")  # the journal an interrupted sweep resumes from
    with claim_outputs(args, {"--out": args.out, "--out journal": partial}):
        return _analyze(args, partial)


def _analyze(args: argparse.Namespace, partial: Path) -> int:
    if args.jobs < 1:
        raise ConfigError(f"--jobs must be >= 1, got {args.jobs}.")
    metric, fp_model, qmodel, data = load_inputs(args, check=_check_metric_mode)
    restart(args, partial)
    config = SensitivityConfig(mode=args.mode, jobs=args.jobs, evidence=not args.no_evidence,
                               progress=show_progress(args), results_path=partial, executor=executor(args))
    report = analyze_sensitivity(fp_model, qmodel, data, config, metric=metric)
    report.write(args.out)
    if partial.exists():
        os.unlink(partial)
    _print_ranking(report)
    return 0


def _check_metric_mode(args: argparse.Namespace) -> None:
    """--evaluate scores model files; local and cumulative make none (their output-space ranking
    scores in the session, with --labels or the outputs' SQNR), so it would be silently ignored."""
    if args.evaluate and args.mode not in ("isolated", "leave-one-out"):
        raise ConfigError(f"--evaluate scores whole model variants, which --mode {args.mode} does not make "
                          "(it ranks layers by output error); add --mode isolated or --mode leave-one-out.")


def _print_ranking(report: Any, top: int = 10) -> None:
    out = sys.stdout
    out.write(f"{report.mode} sensitivity of {len(report.layers)} layers (score: {report.score_meaning})\n")
    for layer in report.layers[:top]:
        out.write(f"{layer.rank:4d}  {layer.node}  [{layer.op_type}]  score {layer.score:.4g}"
                  f"{_why(layer.evidence)}\n")


def _why(evidence: Any) -> str:
    """The evidence of one layer as ``  (outliers x.., best calibrator .., ..% weights -> 0)``."""
    if evidence is None:
        return ""
    parts = []
    if evidence.activation_outlier_ratio is not None:
        parts.append(f"outliers x{evidence.activation_outlier_ratio:.1f}")
    if evidence.best_calibrator is not None:
        parts.append(f"best calibrator {evidence.best_calibrator}")
    if evidence.weight_zero_fraction:
        parts.append(f"{100 * evidence.weight_zero_fraction:.1f}% weights -> 0")
    return "  (" + ", ".join(parts) + ")" if parts else ""
