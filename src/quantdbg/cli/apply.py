"""``quantdbg apply``: re-create the model a plan describes from the next export of the FP32 model.

PLAN is the result of ``quantdbg auto --plan`` (its recipe) or the plan of ``quantdbg fallback --plan``
made from an FP32 model: one calibration pass, no search, byte for byte the original model when the
model and data are the same. Nodes the plan names that the model lacks are all named in one error,
with the closest names. With ``--evaluate CMD`` and a target the result is scored, for a CI gate.
Exit status 0: written (and the target met); 1: the target missed (the model is still written);
2: bad input.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from quantdbg.backends.tensorrt import EngineBuildSpec, build_commands
from quantdbg.cli._build import add_profile_option, print_commands, profile_config
from quantdbg.cli._options import add_data_option, add_out_option, show_progress
from quantdbg.cli._paths import claim_outputs
from quantdbg.cli.app import add_command
from quantdbg.config import Precision
from quantdbg.errors import ConfigError
from quantdbg.evaluation import CommandMetric
from quantdbg.fallback import FallbackTarget
from quantdbg.model.specs import input_specs
from quantdbg.pipeline import apply_recipe
from quantdbg.qdq import QuantizedModel


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Adds the ``apply`` subcommand to ``sub``."""
    parser = add_command(sub, "apply", run, help="Re-create the model a plan describes from a new export.",
                         description="Re-create the mixed-precision model of an `auto` result or a "
                                     "`fallback` plan from MODEL (e.g. the next export) with one calibration "
                                     "pass; with --evaluate, score it against a target. Exit status 0: "
                                     "written (target met); 1: target missed; 2: bad input.")
    parser.add_argument("plan", metavar="PLAN.json",
                        help="`quantdbg auto --plan` result or `quantdbg fallback --plan` plan.")
    parser.add_argument("model", metavar="MODEL",
                        help="FP32 .onnx model with the plan's node names (never modified).")
    add_data_option(parser, required=True, help="Calibration data.")
    add_out_option(parser, metavar="OUT.onnx", help="The re-created model.")
    parser.add_argument("--batch-size", type=int, default=32, help="Samples per batch (default 32).")
    parser.add_argument("--evaluate", metavar="CMD", help="Task metric command scoring the result; {model} "
                        "is replaced by a model path and the last printed line is the metric.")
    parser.add_argument("--lower-is-better", action="store_true", help="The --evaluate metric is "
                        "lower-is-better.")
    target = parser.add_mutually_exclusive_group()
    target.add_argument("--max-rel-loss", type=float, metavar="PCT",
                        help="With --evaluate: the metric within PCT %% of MODEL's (FP32).")
    target.add_argument("--min-metric", type=float, metavar="X",
                        help="With --evaluate: the metric >= X (<= X when lower is better).")
    add_profile_option(parser)


def _gate(args: argparse.Namespace) -> CommandMetric | None:
    """The evaluation command, checked against its target options (None: no evaluation)."""
    has_target = args.max_rel_loss is not None or args.min_metric is not None
    if args.evaluate is None:
        if has_target or args.lower_is_better:
            raise ConfigError("--max-rel-loss, --min-metric and --lower-is-better describe the --evaluate "
                              "command's metric; add --evaluate CMD.")
        return None
    if not has_target:
        raise ConfigError("--evaluate scores the result against a target: add --max-rel-loss PCT or "
                          "--min-metric X.")
    return CommandMetric(args.evaluate, higher_is_better=not args.lower_is_better)


def run(args: argparse.Namespace) -> int:
    """``quantdbg apply``: re-creates the model, writes it, prints its build commands and (with
    ``--evaluate``) the verdict.

    Returns:
        0 when written (and the target met), 1 when the target is missed.

    Raises:
        QuantDbgError: Bad input (the CLI prints it as one line and exits 2).
    """
    with claim_outputs(args, {"--out": args.out}, models={"--out"}, inputs={"PLAN": args.plan}):
        return _apply(args)


def _apply(args: argparse.Namespace) -> int:
    if args.batch_size < 1:
        raise ConfigError(f"--batch-size must be >= 1, got {args.batch_size}.")
    metric = _gate(args)
    qmodel = apply_recipe(args.model, args.data, args.plan, batch_size=args.batch_size,
                          progress=show_progress(args))
    engine = profile_config(args.profile, input_specs(qmodel.model), args.batch_size)
    spec = EngineBuildSpec.from_model(
        args.out, engine, batch_size=args.batch_size, graph=qmodel.model, exclude=qmodel.excluded,
        exclude_precision=qmodel.excluded_precision or Precision.FP16, source=args.model,
        calibration_data=args.data)
    commands = build_commands(spec.engine_beside())
    qmodel.save(args.out)
    _print(qmodel, args.out)
    print_commands(commands)
    return 0 if metric is None else _score(metric, args)


def _print(qmodel: QuantizedModel, out: str) -> None:
    excluded = qmodel.excluded
    precision = f" in {qmodel.excluded_precision.value}" if qmodel.excluded_precision is not None else ""
    sys.stdout.write(f"wrote {out}: {len(qmodel.layers)} layer(s) in INT8, {len(excluded)} kept out"
                     f"{precision}\n")
    for node in excluded:
        sys.stdout.write(f"  {node}\n")


def _score(metric: CommandMetric, args: argparse.Namespace) -> int:
    """Scores the written model against the target; 0 when met, 1 when missed."""
    lower = not metric.higher_is_better
    if args.max_rel_loss is not None:
        reference = metric.from_model(Path(args.model))
        target = FallbackTarget.max_relative_loss(args.max_rel_loss, lower_is_better=lower)
        target = target.with_reference(reference)
    else:
        target = FallbackTarget.min_metric(args.min_metric, lower_is_better=lower)
    value = metric.from_model(Path(args.out))
    met = target.is_met(value)
    sys.stdout.write(f"{'met' if met else 'missed'} {target.describe()}: {metric.name} {value:.6g}\n")
    return 0 if met else 1
