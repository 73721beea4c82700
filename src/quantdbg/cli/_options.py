"""What several subcommands share: the model / data / metric options of ``analyze`` and ``fallback``
with the API objects they turn into, the options every subcommand takes, and where the work runs
(``--ray``)."""
from __future__ import annotations

import argparse
import difflib
import logging
import sys
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, NamedTuple

from quantdbg.config import DEFAULT_OP_TYPES, CalibConfig, QuantConfig
from quantdbg.data import as_model_data, read_npz
from quantdbg.diagnostics.findings import FAIL_ON, FAIL_ON_SHOWN
from quantdbg.errors import ConfigError, DataError, ModelError
from quantdbg.evaluation import Accuracy, CommandMetric, OutputMetric, TaskMetric, Top1Agreement
from quantdbg.evaluation.metrics import METRIC_NAMES
from quantdbg.execution import Executor, RayExecutor
from quantdbg.fallback import FallbackTarget
from quantdbg.model.load import as_loaded, quantized_nodes
from quantdbg.qdq import quantize, records_from_model

TOP1 = "top1"
"""The ``--metric`` choice for top-1 agreement with FP32 (:class:`~quantdbg.evaluation.Top1Agreement`)."""
READY_METRICS: tuple[str, ...] = (*METRIC_NAMES, TOP1)
"""``--metric`` choices: every output metric of :mod:`quantdbg.evaluation`, then top-1 agreement."""


def add_model_options(parser: argparse.ArgumentParser) -> None:
    """Adds MODEL and the data, quantization and metric options ``analyze`` and ``fallback`` share."""
    add_model_argument(parser, help="FP32 model, or a Q/DQ model with --fp32.")
    add_data_option(parser, required=False, help="Calibration data (input name -> samples) when MODEL is "
                    "FP32.")
    parser.add_argument("--eval", required=True, metavar="EVAL.npz", help="Evaluation data.")
    parser.add_argument("--fp32", metavar="FP32.onnx", help="FP32 original of a Q/DQ MODEL.")
    add_method_option(parser, metavar=None, help="Calibrator when MODEL is FP32 (default entropy).")
    add_quant_options(parser)
    parser.add_argument("--batch-size", type=int, default=32, help="Samples per batch (default 32).")
    parser.add_argument("--metric", choices=READY_METRICS, default="sqnr",
                        help="Ready-made metric: an output metric vs FP32, or top1 agreement (default sqnr).")
    parser.add_argument("--labels", metavar="KEY",
                        help="Score accuracy against this integer array of EVAL.npz.")
    parser.add_argument("--evaluate", metavar="CMD", help="Task metric command; {model} is replaced by a "
                        "model path and the last printed line is the metric.")
    parser.add_argument("--lower-is-better", action="store_true",
                        help="The --evaluate metric is lower-is-better.")
    add_execution_options(parser)


_LOCAL_RAY = "local"


def add_execution_options(parser: argparse.ArgumentParser) -> None:
    """Adds ``--ray [ADDRESS]`` and ``--shards N``: run the calibration shards and the sweeps on Ray."""
    parser.add_argument("--ray", nargs="?", const=_LOCAL_RAY, metavar="ADDRESS",
                        help="Run calibration shards, sensitivity variants and search rounds as Ray tasks: "
                             "alone, on a local Ray instance; 'auto' or HOST:PORT joins a running cluster "
                             "(needs quantdbg[ray]).")
    parser.add_argument("--shards", type=int, metavar="N",
                        help="With --ray: calibration data split into N shards (default: the cluster's "
                             "CPUs).")


def executor(args: argparse.Namespace) -> Executor | None:
    """The executor ``--ray`` asks for (None: run here).

    Raises:
        ConfigError: ``--shards`` without ``--ray`` or below 1, or an ADDRESS that is not one.
    """
    ray, shards = getattr(args, "ray", None), getattr(args, "shards", None)
    if shards is not None and shards < 1:
        raise ConfigError(f"--shards must be >= 1, got {shards}.")
    if ray is None:
        if shards is not None:
            raise ConfigError("--shards splits the calibration over --ray workers; add --ray.")
        return None
    if ray != _LOCAL_RAY and ray != "auto" and ":" not in ray:
        raise ConfigError(f"--ray {ray!r} is not a cluster address: give 'auto' or HOST:PORT, nothing for a "
                          "local Ray instance (put --ray after MODEL).")
    return RayExecutor(None if ray == _LOCAL_RAY else ray)


def on_executor(calib: CalibConfig, args: argparse.Namespace, run: Executor | None) -> CalibConfig:
    """``calib`` collecting its statistics on ``run`` in ``--shards`` shards (unchanged without one)."""
    return calib if run is None else replace(calib, executor=run, shards=getattr(args, "shards", None))


def load_models(args: argparse.Namespace) -> tuple[Any, Any]:
    """The FP32 model and the quantized one: MODEL's own Q/DQ nodes, or MODEL quantized from --data.

    Returns:
        (FP32 LoadedModel, QuantizedModel).

    Raises:
        ModelError: A Q/DQ MODEL without --fp32.
        ConfigError: --fp32 with an FP32 MODEL, or an FP32 MODEL without --data.
    """
    loaded = as_loaded(args.model, allow_quantized=True)
    found = quantized_nodes(loaded.proto)
    if found:
        if not args.fp32:
            raise ModelError(f"MODEL {args.model!r} is already quantized ({len(found)} Q/DQ node(s)); "
                             "give its FP32 original with --fp32 FP32.onnx.")
        if args.exclude or args.op_types or args.op_types_to_exclude:
            raise ConfigError(f"MODEL {args.model!r} is already quantized: --exclude, --op-types and "
                              "--op-types-to-exclude choose the layers of an FP32 MODEL; drop them.")
        return as_loaded(args.fp32), records_from_model(loaded)
    if args.fp32:
        raise ConfigError(f"--fp32 is only for a Q/DQ MODEL, but {args.model!r} holds no Q/DQ nodes; "
                          "drop --fp32.")
    if not args.data:
        raise ConfigError(f"MODEL {args.model!r} is FP32: give calibration data with --data CALIB.npz to "
                          "quantize it.")
    calib = on_executor(CalibConfig(method=args.method), args, executor(args))
    qmodel = quantize(loaded, args.data, calib, quant_config(args), batch_size=args.batch_size,
                      progress=show_progress(args))
    return loaded, qmodel


def task_metric(args: argparse.Namespace) -> Any:
    """The metric the options select: --evaluate's command, --labels' accuracy, or --metric; the
    output SQNR for a --min-sqnr target.

    Raises:
        ConfigError: Contradicting options.
        DataError: The --labels array is missing.
    """
    if getattr(args, "min_sqnr", None) is not None:
        if args.evaluate or args.labels:
            raise ConfigError("--min-sqnr judges the output SQNR; --evaluate/--labels go with "
                              "--min-metric or --max-rel-loss.")
        if args.metric not in (None, "sqnr"):
            raise ConfigError(f"--min-sqnr judges the output SQNR, not --metric {args.metric}; drop "
                              "--metric, or give --min-metric or --max-rel-loss.")
        return OutputMetric("sqnr")
    if args.lower_is_better and not args.evaluate:
        raise ConfigError("--lower-is-better describes the --evaluate command's metric; add --evaluate CMD.")
    if args.evaluate and args.labels:
        raise ConfigError("--evaluate and --labels both define the task metric; give only one.")
    deps = getattr(args, "evaluate_deps", None) or ()
    if deps and not args.evaluate:
        raise ConfigError("--evaluate-deps names files the --evaluate command reads; add --evaluate CMD.")
    if args.evaluate:
        return CommandMetric(args.evaluate, higher_is_better=not args.lower_is_better, deps=deps)
    if args.labels:
        return Accuracy(_labels(args.eval, args.labels), origin=f"--labels {args.labels!r} of {args.eval!r}")
    return Top1Agreement() if args.metric == TOP1 else OutputMetric(args.metric)


def add_target_options(parser: argparse.ArgumentParser) -> None:
    """Adds the target a fallback search must meet: --min-metric, --max-rel-loss or --min-sqnr."""
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("--min-metric", type=float, metavar="X",
                        help="Task metric >= X (<= X when lower is better).")
    target.add_argument("--max-rel-loss", type=float, metavar="PCT",
                        help="Task metric within PCT %% of FP32.")
    target.add_argument("--min-sqnr", type=float, metavar="DB",
                        help="Output SQNR against FP32 >= DB dB (no task metric needed).")


def fallback_target(args: argparse.Namespace, metric: TaskMetric) -> FallbackTarget:
    """The target --min-metric, --max-rel-loss or --min-sqnr set, in the direction of ``metric``
    (the one :func:`task_metric` builds: the output SQNR for --min-sqnr)."""
    if args.min_sqnr is not None:
        return FallbackTarget.min_sqnr(args.min_sqnr)
    lower = not metric.higher_is_better
    if args.max_rel_loss is not None:
        return FallbackTarget.max_relative_loss(args.max_rel_loss, lower_is_better=lower)
    return FallbackTarget.min_metric(args.min_metric, lower_is_better=lower)


def _labels(path: str, key: str) -> Any:
    try:
        return read_npz(path, [key])[key]
    except DataError as err:
        raise DataError(f"--labels {key!r}: {err}") from err


def eval_data(args: argparse.Namespace, fp_model: Any) -> Any:
    """The --eval samples in batches of --batch-size (or of the model's fixed batch dimension), for
    the FP32 model's inputs.

    Raises:
        ConfigError: --batch-size < 1.
        DataError: The file does not hold the model's inputs.
    """
    if args.batch_size < 1:
        raise ConfigError(f"--batch-size must be >= 1, got {args.batch_size}.")
    return as_model_data(args.eval, as_loaded(fp_model).proto, args.batch_size)


class Inputs(NamedTuple):
    """What ``analyze`` and ``fallback`` work on."""

    metric: Any
    fp_model: Any
    qmodel: Any
    data: Any


def load_inputs(args: argparse.Namespace,
                check: Callable[[argparse.Namespace], None] | None = None) -> Inputs:
    """The task metric, the FP32 and quantized models and the evaluation data the model / data /
    metric options select, in that order, with ``check`` (a subcommand's own checks of its options)
    run before the models: option checks cost nothing, quantizing MODEL does.

    Raises:
        QuantDbgError: As :func:`task_metric`, ``check``, :func:`load_models` and :func:`eval_data`.
    """
    metric = task_metric(args)
    if check is not None:
        check(args)
    fp_model, qmodel = load_models(args)
    return Inputs(metric, fp_model, qmodel, eval_data(args, fp_model))


# --------------------------------------------------------------------------------------------
# Conventions every subcommand shares (flag names users already type with trtexec, Polygraphy and
# ModelOpt; one default for progress bars; -v/-q after the subcommand too)
# --------------------------------------------------------------------------------------------


def add_common_options(parser: argparse.ArgumentParser) -> None:
    """Adds -v/-q and --progress/--no-progress to a subcommand (every subcommand gets them)."""
    group = parser.add_argument_group("common options")
    group.add_argument("-v", "--verbose", dest="sub_verbose", action="count", default=0,
                       help="More log output (-vv: debug); also accepted before the subcommand.")
    group.add_argument("-q", "--quiet", dest="sub_quiet", action="count", default=0,
                       help="Less log output (errors only); also accepted before the subcommand.")
    bars = group.add_mutually_exclusive_group()
    bars.add_argument("--progress", dest="progress", action="store_true", default=None,
                      help="Draw progress bars even when stderr is not a terminal.")
    bars.add_argument("--no-progress", dest="progress", action="store_false",
                      help="Do not draw progress bars (default: drawn when stderr is a terminal).")


def show_progress(args: argparse.Namespace) -> bool:
    """Whether to draw progress bars: --progress / --no-progress, else when stderr is a terminal."""
    chosen = getattr(args, "progress", None)
    return sys.stderr.isatty() if chosen is None else bool(chosen)


def log_level(args: argparse.Namespace) -> int:
    """The logging level -v/-q select, counted before and after the subcommand alike."""
    verbose = getattr(args, "verbose", 0) + getattr(args, "sub_verbose", 0)
    quiet = getattr(args, "quiet", 0) + getattr(args, "sub_quiet", 0)
    return min(max(logging.WARNING + 10 * (quiet - verbose), logging.DEBUG), logging.ERROR)


# ModelOpt's command line spells its flags with underscores (--calibration_data_path, ...); they are
# accepted as aliases of quantdbg's flags, listed after them, and left out of --help and error messages
# (every flag quantdbg itself defines is spelled with hyphens).


def hidden_spelling(flag: str) -> bool:
    """True for an alias accepted but not shown: ModelOpt's underscore spelling of a flag."""
    return flag.startswith("--") and "_" in flag


def add_model_argument(parser: argparse.ArgumentParser, *, help: str) -> None:
    """Adds MODEL, which ModelOpt's users give as ``--onnx_path MODEL`` (one of the two is required:
    :func:`resolve_model`)."""
    parser.add_argument("model", metavar="MODEL", nargs="?", help=help)
    parser.add_argument("--onnx_path", metavar="MODEL", help=argparse.SUPPRESS)


def resolve_model(args: argparse.Namespace) -> str | None:
    """Puts ``--onnx_path`` into ``args.model``; returns the usage error when MODEL is given twice or
    not at all (None: fine, or a subcommand without MODEL)."""
    if not hasattr(args, "onnx_path"):
        return None
    if args.model is not None and args.onnx_path is not None:
        return (f"MODEL {args.model!r} and --onnx_path {args.onnx_path!r} both name the model; give only "
                "one of them")
    if args.model is None and args.onnx_path is None:
        return "the following arguments are required: MODEL"
    args.model = args.model if args.model is not None else args.onnx_path
    return None


def add_method_option(parser: argparse.ArgumentParser, *, metavar: str | None, help: str) -> None:
    """Adds ``--method`` (default entropy), with ModelOpt's ``--calibration_method`` as an alias."""
    parser.add_argument("--method", "--calibration_method", default="entropy", metavar=metavar, help=help)


def add_data_option(parser: argparse.ArgumentParser, *, required: bool, help: str) -> None:
    """Adds ``--data CALIB.npz``, with ModelOpt's ``--calibration_data_path`` as an alias."""
    parser.add_argument("--data", "--calibration_data_path", required=required, metavar="CALIB.npz",
                        help=help)


def add_out_option(parser: argparse.ArgumentParser, *, metavar: str, help: str,
                   required: bool = True) -> None:
    """Adds ``--out`` with ``-o`` / ``--output`` (Polygraphy's spelling) and ModelOpt's
    ``--output_path`` as aliases."""
    parser.add_argument("-o", "--out", "--output", "--output_path", required=required, metavar=metavar,
                        help=help)


def add_quant_options(parser: argparse.ArgumentParser) -> None:
    """Adds which layers are quantized: --exclude, --op-types and --op-types-to-exclude, with
    ModelOpt's ``--nodes-to-exclude`` / ``--nodes_to_exclude`` as aliases of --exclude."""
    parser.add_argument("--exclude", "--nodes-to-exclude", "--nodes_to_exclude", nargs="+", default=[],
                        metavar="GLOB",
                        help="Node names or globs (fnmatch, not regular expressions) to keep out of INT8.")
    parser.add_argument("--op-types", nargs="+", metavar="OP",
                        help=f"Op types to quantize (default: {', '.join(DEFAULT_OP_TYPES)}).")
    parser.add_argument("--op-types-to-exclude", "--op_types_to_exclude", nargs="+", default=[], metavar="OP",
                        help="Op types to leave out of --op-types (ModelOpt's spelling).")


def quant_config(args: argparse.Namespace) -> QuantConfig:
    """The QuantConfig --exclude, --op-types and --op-types-to-exclude describe.

    Raises:
        ConfigError: --op-types-to-exclude names an op type that is not quantized, or removes all.
    """
    op_types = tuple(args.op_types) if args.op_types else DEFAULT_OP_TYPES
    for op in args.op_types_to_exclude:
        if op not in op_types:
            raise unknown_choice("--op-types-to-exclude", op, op_types, what="quantized op type")
    kept = tuple(op for op in op_types if op not in args.op_types_to_exclude)
    if not kept:
        raise ConfigError(f"--op-types-to-exclude removes every quantized op type ({', '.join(op_types)}); "
                          "nothing would be quantized.")
    return QuantConfig(op_types=kept, exclude=tuple(args.exclude))


def unknown_choice(flag: str, value: str, choices: Sequence[str], *, what: str) -> ConfigError:
    """The error for a value outside ``choices``, with the closest ones (difflib) as suggestions."""
    near = difflib.get_close_matches(value, list(choices), n=3, cutoff=0.5)
    hint = f" Did you mean {' or '.join(map(repr, near))}?" if near else ""
    return ConfigError(f"{flag} {value!r} is not a {what} (choose from {', '.join(choices)}).{hint}")


def add_fail_on_option(parser: argparse.ArgumentParser, *, default: str | None) -> None:
    """Adds ``--fail-on`` with the one severity scale lint and doctor share."""
    shown = "{" + ",".join(FAIL_ON_SHOWN) + "}"
    default_text = default if default is not None else "no gate: exit 0 whatever is found"
    parser.add_argument("--fail-on", choices=FAIL_ON, default=default, metavar=shown,
                        help="Exit with status 1 when a finding of this severity or worse is found (for CI): "
                             "high, medium, low or info, or never (lint's former error and warning still "
                             f"mean high and medium; default: {default_text}).")
