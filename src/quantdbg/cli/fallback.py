"""``quantdbg fallback``: the fewest layers to keep out of INT8 so MODEL meets a target.

Takes the model, data and metric options of ``quantdbg analyze``; writes the mixed-precision model
and its fallback plan (JSON, with the trtexec / Polygraphy commands that build its engine). A run
stopped early resumes from ``PLAN.json.partial``, the journal of the ranking and every evaluation
made (``--restart`` starts over).
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from quantdbg._io import commit_together
from quantdbg._journal import Journal
from quantdbg.cli._build import add_profile_option, print_commands, profile_config
from quantdbg.cli._options import (
    add_model_options,
    add_out_option,
    add_target_options,
    executor,
    fallback_target,
    load_inputs,
    quant_config,
    show_progress,
    task_metric,
)
from quantdbg.cli._paths import claim_outputs
from quantdbg.cli._resume import add_resume_options, restart
from quantdbg.cli.app import add_command
from quantdbg.config import Precision
from quantdbg.fallback import FallbackConfig, auto_fallback
from quantdbg.fallback.end_to_end import fallback_ingredients
from quantdbg.model.specs import input_specs
from quantdbg.sensitivity import SensitivityConfig, SensitivityReport, VariantEvaluator
from quantdbg.sensitivity.config import MODES
from quantdbg.sensitivity.journaled import JournaledEvaluator


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Adds the ``fallback`` subcommand to ``sub``."""
    fallback = add_command(sub, "fallback", run_fallback,
                           help="Find the fewest layers to keep out of INT8 for a target.",
                           description="Search the smallest set of layers to run in FP16 so MODEL meets "
                                       "a target, and write the mixed-precision model and its plan.")
    add_model_options(fallback)
    add_target_options(fallback)
    fallback.add_argument("--mode", choices=MODES, default="local", help="Ranking mode (default local).")
    fallback.add_argument("--precision", choices=[p.value for p in Precision], default=Precision.FP16.value,
                          help="Layers kept out of INT8 compute in fp16 (TensorRT) or fp32 (CPU backends).")
    fallback.add_argument("--max-evaluations", type=int,
                          help="Search budget (default: the search's bound for max(4, L/10) layers).")
    fallback.add_argument("--report", metavar="RESULT.json",
                          help="Walk this analyze report instead of ranking.")
    add_out_option(fallback, metavar="MIXED.onnx", help="The mixed-precision model.")
    fallback.add_argument("--plan", required=True, metavar="PLAN.json", help="The fallback plan (JSON).")
    add_resume_options(fallback, "PLAN.json.partial")
    add_profile_option(fallback)


def run_fallback(args: argparse.Namespace) -> int:
    """``quantdbg fallback``: searches, then writes the plan and (when met) the mixed model.

    Returns:
        0 when the target is met; 2 when it is not (the plan says why).

    Raises:
        QuantDbgError: Bad input (the CLI prints it as one line and exits 2).
    """
    partial = Path(f"{args.plan}.partial")  # the journal a stopped run resumes from
    outputs = {"--out": args.out, "--plan": args.plan, "--plan journal": partial}
    with claim_outputs(args, outputs, models={"--out"}):
        return _fallback(args, partial)


def _fallback(args: argparse.Namespace, partial: Path) -> int:
    target = fallback_target(args, task_metric(args))
    metric, fp_model, qmodel, data = load_inputs(args)
    engine = profile_config(args.profile, input_specs(fp_model.proto), args.batch_size)
    report = SensitivityReport.read(args.report) if args.report else None
    run = executor(args)
    config = FallbackConfig(SensitivityConfig(mode=args.mode, progress=show_progress(args), executor=run),
                            precision=Precision(args.precision), max_evaluations=args.max_evaluations,
                            executor=run)
    restart(args, partial)
    plain = VariantEvaluator(fp_model, qmodel, data, metric)
    ingredients = fallback_ingredients(plain, target, config, report)
    with Journal.open(partial, "fallback", ingredients) as journal, \
            JournaledEvaluator(fp_model, qmodel, data, metric, journal=journal) as evaluator:
        result = auto_fallback(evaluator, target, config, report=report)
    plan = result.plan
    if qmodel.calibration is not None:  # quantized here: how, so `quantdbg apply` re-creates the model
        plan = replace(plan, calib=qmodel.calibration.config, quant=quant_config(args))
    if result.mixed is None:
        plan.write(args.plan)
        partial.unlink(missing_ok=True)
        sys.stderr.write(f"quantdbg fallback: error: {plan.message} Plan written to {args.plan}.\n")
        return 2
    with commit_together({"--out": args.out, "--plan": args.plan}) as staged:
        result.mixed.save(staged["--out"])  # the mixed model and its plan appear together or not at all
        plan = plan.with_build(args.out, data, config=engine, batch_size=args.batch_size,
                               source=args.fp32 or args.model, calibration_data=args.data,
                               graph=staged["--out"])
        plan.write(staged["--plan"])
    partial.unlink(missing_ok=True)
    _print_plan(plan)
    if plan.status != "met":
        sys.stderr.write(f"quantdbg fallback: error: {plan.message}\n")
        return 2
    return 0


def _print_plan(plan: Any) -> None:
    sys.stdout.write(f"{plan.status}: {len(plan.exclude)} of {len(plan.ranking)} layer(s) kept out of INT8 "
                     f"in {plan.precision.value}, value {plan.value:.6g}, {plan.n_evaluations} evaluations "
                     "+ 1 verification\n")
    for node in plan.exclude:
        sys.stdout.write(f"  {node}\n")
    print_commands(plan.commands)
