"""``quantdbg auto``: the whole job in one command -- calibrate, repair INT8, rank, search the fewest
layers to keep out of INT8, verify, report.

Writes the final model (``--out``), the result with its re-appliable recipe (``--plan``, a
``quantdbg.auto/1`` document) and optionally the HTML report. Exit status 0 when the target is
met, 1 when it is not (the files hold the best model found and the verdict says why), 2 on bad
input. A run stopped early resumes from ``--resume`` (default ``PLAN.json.partial``), the journal
of the finished passes and every evaluation made; ``--restart`` starts over.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from quantdbg._io import commit_together
from quantdbg.backends.tensorrt import TrtConfig
from quantdbg.cli import _options as opts
from quantdbg.cli._build import add_profile_option, print_commands, profile_config
from quantdbg.cli._paths import claim_outputs
from quantdbg.cli._resume import add_resume_options, restart
from quantdbg.cli.app import add_command
from quantdbg.config import CalibConfig
from quantdbg.data import load_npz
from quantdbg.errors import ConfigError
from quantdbg.evaluation import TaskMetric
from quantdbg.model.load import as_loaded
from quantdbg.model.specs import input_specs
from quantdbg.pipeline import AutoConfig, AutoResult, auto
from quantdbg.pipeline.config import REPAIRS
from quantdbg.report import write_report


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Adds the ``auto`` subcommand to ``sub``."""
    auto = add_command(sub, "auto", run,
                       help="The whole job: calibrate, repair INT8, fall back the fewest layers.",
                       description="Calibrate MODEL, repair its INT8 ranges, rank its layers, keep the "
                                   "fewest out of INT8 so it meets a target, verify and report. Exit "
                                   "status 0: met; 1: not met (the best model found is written); 2: bad "
                                   "input.")
    opts.add_model_argument(auto, help="FP32 .onnx model (never modified).")
    opts.add_data_option(auto, required=True, help="Calibration data.")
    auto.add_argument("--eval", required=True, metavar="EVAL.npz", help="Evaluation data.")
    metric = auto.add_mutually_exclusive_group()
    metric.add_argument("--evaluate", metavar="CMD", help="Task metric command; {model} is replaced by a "
                        "model path and the last printed line is the metric (it runs on the real models).")
    metric.add_argument("--metric", choices=opts.READY_METRICS, help="Ready-made metric against FP32.")
    metric.add_argument("--labels", metavar="KEY", help="Accuracy against this integer array of EVAL.npz.")
    auto.add_argument("--lower-is-better", action="store_true",
                      help="The --evaluate metric is lower-is-better.")
    opts.add_target_options(auto)
    opts.add_out_option(auto, metavar="MIXED.onnx", help="The final model.")
    auto.add_argument("--plan", required=True, metavar="PLAN.json", help="The result and its recipe (JSON).")
    auto.add_argument("--html", metavar="REPORT.html", help="Also write the HTML report.")
    _add_settings(auto)


def _add_settings(auto: argparse.ArgumentParser) -> None:
    opts.add_method_option(auto, listed=True,
                           help="Default calibrator the repairs start from (default entropy).")
    auto.add_argument("--repairs", nargs="*", choices=REPAIRS, default=list(REPAIRS), metavar="REPAIR",
                      help=f"INT8 repairs to try, in order ({', '.join(REPAIRS)}; default all; none: give "
                           "no value).")
    opts.add_search_options(auto)
    auto.add_argument("--max-fallback", type=float, default=25.0, metavar="PCT",
                      help="Most layers kept out of INT8, in %% of the quantized layers (default 25).")
    auto.add_argument("--batch-size", type=int, default=32, help="Samples per batch (default 32).")
    auto.add_argument("--resume", metavar="FILE", help="Journal to resume from and write (default "
                      "PLAN.json.partial, deleted once the run is done).")
    add_resume_options(auto, "--resume")
    add_profile_option(auto)
    opts.add_quant_options(auto)
    opts.add_execution_options(auto)


def _metric(args: argparse.Namespace) -> TaskMetric:
    """The task metric: --evaluate, --labels or --metric; the output SQNR for --min-sqnr.

    Raises:
        ConfigError: A metric target without a task metric, or contradicting options.
    """
    if args.evaluate is None and args.labels is None and args.metric is None and args.min_sqnr is None:
        raise ConfigError("--min-metric and --max-rel-loss judge a task metric: give --evaluate CMD, "
                          "--labels KEY or --metric NAME (or the target --min-sqnr DB, which reads the "
                          "output SQNR).")
    return opts.task_metric(args)


def _config(args: argparse.Namespace, resume: Path, engine: TrtConfig | None) -> AutoConfig:
    if args.batch_size < 1:
        raise ConfigError(f"--batch-size must be >= 1, got {args.batch_size}.")
    if not 0.0 < args.max_fallback <= 100.0:
        raise ConfigError(f"--max-fallback is a percentage in (0, 100], got {args.max_fallback:g}.")
    run = opts.executor(args)
    calib = opts.on_executor(CalibConfig(method=args.method), args, run)
    return AutoConfig(calib, opts.quant_config(args), tuple(args.repairs),
                      fallback=opts.fallback_config(args, run),
                      max_fallback_share=args.max_fallback / 100.0, batch_size=args.batch_size,
                      progress=opts.show_progress(args), resume_path=resume, engine=engine)


def run(args: argparse.Namespace) -> int:
    """``quantdbg auto``: runs the flow, writes the model, the result and (when asked) the report.

    Returns:
        0 when the target is met, 1 when it is not.

    Raises:
        QuantDbgError: Bad input (the CLI prints it as one line and exits 2).
    """
    resume = Path(args.resume) if args.resume else Path(f"{args.plan}.partial")
    outputs = {"--out": args.out, "--plan": args.plan, "--html": args.html, "--resume": resume}
    with claim_outputs(args, outputs, models={"--out"}):
        return _auto(args, resume)


def _auto(args: argparse.Namespace, resume: Path) -> int:
    metric = _metric(args)
    target = opts.fallback_target(args, metric)
    model = as_loaded(args.model)
    config = _config(args, resume, profile_config(args.profile, input_specs(model.proto), args.batch_size))
    calib = load_npz(args.data, args.batch_size, inputs=list(input_specs(model.proto)))
    restart(args, resume)
    result = auto(model, calib, opts.eval_data(args, model.proto), target, metric=metric, config=config)
    final = result.model
    assert final is not None  # a run always ends with a model
    # The build commands name the model where it is saved, and the files ModelOpt's command reads.
    result = result.located(args.out, source=args.model, calibration_data=args.data)
    with commit_together({"--out": args.out, "--plan": args.plan, "--html": args.html}) as staged:
        final.save(staged["--out"])  # the model, its plan and report appear together or not at all
        result.write(staged["--plan"])
        if "--html" in staged:
            write_report(result, html=staged["--html"])
    if args.resume is None and resume.exists():
        os.unlink(resume)
    _print(result)
    return 0 if result.met else 1


def _print(result: AutoResult) -> None:
    out = sys.stdout
    out.write(f"{result.message}\n")
    phases = ", ".join(f"{phase} {count}" for phase, count in result.evaluations.items())
    out.write(f"evaluations: {phases} ({result.n_evaluations} in all)\n")
    for node in result.exclude:
        out.write(f"  {node}\n")
    if result.plan is not None:
        print_commands(result.plan.commands)
