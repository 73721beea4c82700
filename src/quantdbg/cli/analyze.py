"""``quantdbg analyze`` (per-layer sensitivity) and ``quantdbg fallback`` (FP16 fallback search).

MODEL is an FP32 model (quantized here from ``--data`` with ``--method``) or a Q/DQ model made
elsewhere, whose FP32 original is given with ``--fp32``. ``--evaluate 'CMD {model}'`` makes a
command's last printed line the task metric.
"""
from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path
from typing import Any

from quantdbg.errors import ConfigError, DataError, ModelError

logger = logging.getLogger(__name__)

OUTPUT_METRICS = ("sqnr", "cosine", "sample_cosine", "rel_l2", "max_abs")
READY_METRICS = (*OUTPUT_METRICS, "top1")
MODES = ("local", "cumulative", "isolated", "leave-one-out")


def register(sub: Any) -> None:
    """Adds the ``analyze`` and ``fallback`` subcommands."""
    analyze = sub.add_parser("analyze", help="Rank quantized layers by sensitivity (per ONNX node name).",
                             description="Rank the quantized layers of MODEL by how much INT8 hurts them.")
    _common(analyze)
    analyze.add_argument("--mode", choices=MODES, default="local",
                         help="local (cheap, one pass), cumulative, isolated or leave-one-out "
                              "(default local).")
    analyze.add_argument("--jobs", type=int, default=1, help="Processes for isolated / leave-one-out.")
    analyze.add_argument("--no-evidence", action="store_true", help="Skip the weight/activation evidence.")
    analyze.add_argument("--out", required=True, metavar="RESULT.json", help="Where the report goes.")
    analyze.set_defaults(func=run_analyze)

    fallback = sub.add_parser("fallback", help="Find the fewest layers to keep out of INT8 for a target.",
                              description="Search the smallest set of layers to run in FP16 so MODEL meets "
                                          "a target, and write the mixed-precision model and its plan.")
    _common(fallback)
    target = fallback.add_mutually_exclusive_group(required=True)
    target.add_argument("--min-metric", type=float, metavar="X",
                        help="Task metric >= X (<= X when lower is better).")
    target.add_argument("--max-rel-loss", type=float, metavar="PCT",
                        help="Task metric within PCT %% of FP32.")
    target.add_argument("--min-sqnr", type=float, metavar="DB", help="Output SQNR >= DB dB.")
    fallback.add_argument("--mode", choices=MODES, default="local", help="Ranking mode (default local).")
    fallback.add_argument("--precision", choices=("fp16", "fp32"), default="fp16",
                          help="Fallback layers compute in fp16 (TensorRT) or fp32 (CPU backends).")
    fallback.add_argument("--max-evaluations", type=int, help="Search budget (default 2*log2(L)+2).")
    fallback.add_argument("--report", metavar="RESULT.json",
                          help="Walk this analyze report instead of ranking.")
    fallback.add_argument("--out", required=True, metavar="MIXED.onnx", help="The mixed-precision model.")
    fallback.add_argument("--plan", required=True, metavar="PLAN.json", help="The fallback plan (JSON).")
    fallback.set_defaults(func=run_fallback)


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", metavar="MODEL", help="FP32 model, or a Q/DQ model with --fp32.")
    parser.add_argument("--data", metavar="CALIB.npz", help="Calibration data (input name -> samples).")
    parser.add_argument("--eval", required=True, metavar="EVAL.npz", help="Evaluation data.")
    parser.add_argument("--fp32", metavar="FP32.onnx", help="FP32 original of a Q/DQ MODEL.")
    parser.add_argument("--method", default="entropy",
                        help="Calibrator when MODEL is FP32 (default entropy).")
    parser.add_argument("--op-types", nargs="+", metavar="OP", help="Op types to quantize (default: Conv, "
                        "ConvTranspose, Gemm, MatMul).")
    parser.add_argument("--batch-size", type=int, default=32, help="Samples per batch (default 32).")
    parser.add_argument("--metric", choices=READY_METRICS, default="sqnr",
                        help="Ready-made metric: an output metric vs FP32, or top1 agreement (default sqnr).")
    parser.add_argument("--labels", metavar="KEY",
                        help="Score accuracy against this integer array of EVAL.npz.")
    parser.add_argument("--evaluate", metavar="CMD", help="Task metric command; {model} is replaced by a "
                        "model path and the last printed line is the metric.")
    parser.add_argument("--lower-is-better", action="store_true",
                        help="The --evaluate metric is lower-is-better.")
    parser.add_argument("--progress", action="store_true", help="Show progress bars.")


def _load_models(args: argparse.Namespace) -> tuple[Any, Any]:
    """Returns (FP32 ModelProto, QuantizedModel)."""
    from quantdbg.model import load_model, quantized_nodes
    from quantdbg.qdq import records_from_model

    loaded = load_model(args.model, allow_quantized=True)
    found = quantized_nodes(loaded)
    if found:
        if not args.fp32:
            raise ModelError(f"MODEL {args.model!r} is already quantized ({len(found)} Q/DQ node(s)); "
                             "give its FP32 original with --fp32 FP32.onnx.")
        return load_model(args.fp32), records_from_model(loaded)
    if args.fp32:
        raise ConfigError(f"--fp32 is only for a Q/DQ MODEL, but {args.model!r} holds no Q/DQ nodes; "
                          "drop --fp32.")
    if not args.data:
        raise ConfigError(f"MODEL {args.model!r} is FP32: give calibration data with --data CALIB.npz to "
                          "quantize it.")
    from quantdbg.config import CalibConfig, QuantConfig
    from quantdbg.qdq import quantize

    quant = QuantConfig(op_types=tuple(args.op_types)) if args.op_types else QuantConfig()
    qmodel = quantize(loaded, args.data, CalibConfig(method=args.method), quant, batch_size=args.batch_size,
                      progress=args.progress)
    return loaded, qmodel


def _metric(args: argparse.Namespace, fp_model: Any) -> Any:
    from quantdbg.evaluation import Accuracy, CommandMetric, OutputMetric, Top1Agreement

    if args.lower_is_better and not args.evaluate:
        raise ConfigError("--lower-is-better describes the --evaluate command's metric; add --evaluate CMD.")
    if args.evaluate and args.labels:
        raise ConfigError("--evaluate and --labels both define the task metric; give only one.")
    if args.evaluate:
        return CommandMetric(args.evaluate, higher_is_better=not args.lower_is_better)
    if args.labels:
        return Accuracy(_labels(args.eval, args.labels))
    return Top1Agreement() if args.metric == "top1" else OutputMetric(args.metric)


def _labels(path: str, key: str) -> Any:
    import numpy as np

    if not Path(path).is_file():
        raise DataError(f"Data file {path!r} does not exist.")
    with np.load(path, allow_pickle=False) as npz:
        if key not in npz.files:
            raise DataError(f"--labels {key!r}: {path!r} has no such array (it holds {sorted(npz.files)}).")
        return npz[key]


def _eval_data(args: argparse.Namespace, fp_model: Any) -> Any:
    from quantdbg.data import load_npz
    from quantdbg.model import input_specs

    if args.batch_size < 1:
        raise ConfigError(f"--batch-size must be >= 1, got {args.batch_size}.")
    return load_npz(args.eval, args.batch_size, inputs=list(input_specs(fp_model)))


def _check_out(path: str, flag: str) -> None:
    folder = Path(path).resolve().parent
    if not folder.is_dir():
        raise ConfigError(f"{flag} {path!r}: folder {str(folder)!r} does not exist.")


def run_analyze(args: argparse.Namespace) -> int:
    """``quantdbg analyze``: writes the sensitivity report and prints the top of the ranking."""
    from quantdbg.sensitivity import SensitivityConfig, analyze_sensitivity

    _check_out(args.out, "--out")
    if args.jobs < 1:
        raise ConfigError(f"--jobs must be >= 1, got {args.jobs}.")
    fp_model, qmodel = _load_models(args)
    metric = _metric(args, fp_model)
    data = _eval_data(args, fp_model)
    partial = Path(f"{args.out}.partial")  # an interrupted sweep resumes from here
    config = SensitivityConfig(mode=args.mode, jobs=args.jobs, evidence=not args.no_evidence,
                               progress=args.progress, results_path=partial)
    report = analyze_sensitivity(fp_model, qmodel, data, config, metric=metric)
    report.write(args.out)
    if partial.exists():
        os.unlink(partial)
    _print_ranking(report)
    return 0


def _print_ranking(report: Any, top: int = 10) -> None:
    out = sys.stdout
    out.write(f"{report.mode} sensitivity of {len(report.layers)} layers (score: {report.score_meaning})\n")
    for layer in report.layers[:top]:
        ev = layer.evidence
        why = ""
        if ev is not None:
            parts = []
            if ev.activation_outlier_ratio is not None:
                parts.append(f"outliers x{ev.activation_outlier_ratio:.1f}")
            if ev.best_calibrator is not None:
                parts.append(f"best calibrator {ev.best_calibrator}")
            if ev.weight_zero_fraction:
                parts.append(f"{100 * ev.weight_zero_fraction:.1f}% weights -> 0")
            why = "  (" + ", ".join(parts) + ")" if parts else ""
        out.write(f"{layer.rank:4d}  {layer.node}  [{layer.op_type}]  score {layer.score:.4g}{why}\n")


def _target(args: argparse.Namespace) -> Any:
    from quantdbg.fallback import FallbackTarget

    if args.min_sqnr is not None:
        if args.evaluate or args.labels:
            raise ConfigError("--min-sqnr judges the output SQNR; --evaluate/--labels go with "
                              "--min-metric or --max-rel-loss.")
        return FallbackTarget.min_sqnr(args.min_sqnr)
    if args.max_rel_loss is not None:
        return FallbackTarget.max_relative_loss(args.max_rel_loss, lower_is_better=args.lower_is_better)
    return FallbackTarget.min_metric(args.min_metric, lower_is_better=args.lower_is_better)


def run_fallback(args: argparse.Namespace) -> int:
    """``quantdbg fallback``: searches, then writes the plan and (when met) the mixed model."""
    from quantdbg.config import Precision
    from quantdbg.fallback import FallbackConfig, auto_fallback
    from quantdbg.sensitivity import SensitivityConfig, SensitivityReport, VariantEvaluator

    _check_out(args.out, "--out")
    _check_out(args.plan, "--plan")
    target = _target(args)
    fp_model, qmodel = _load_models(args)
    metric = _metric(args, fp_model)
    if target.kind != "sqnr" and not metric.higher_is_better and not args.lower_is_better:
        target = type(target)(target.kind, target.threshold, True, target.reference)
    data = _eval_data(args, fp_model)
    report = SensitivityReport.read(args.report) if args.report else None
    config = FallbackConfig(SensitivityConfig(mode=args.mode, progress=args.progress),
                            precision=Precision(args.precision), max_evaluations=args.max_evaluations)
    with VariantEvaluator(fp_model, qmodel, data, metric) as evaluator:
        result = auto_fallback(evaluator, target, config, report=report)
    plan = result.plan
    if result.mixed is None:
        plan.write(args.plan)
        sys.stderr.write(f"quantdbg fallback: error: {plan.message} Plan written to {args.plan}.\n")
        return 2
    result.mixed.save(args.out)
    plan = plan.with_build(args.out, data)
    plan.write(args.plan)
    sys.stdout.write(f"{plan.status}: {len(plan.nodes)} of {len(plan.ranking)} layer(s) in "
                     f"{plan.precision.value}, value {plan.value:.6g}, {plan.n_evaluations} evaluations "
                     "+ 1 verification\n")
    for node in plan.nodes:
        sys.stdout.write(f"  {node}\n")
    if plan.status != "met":
        sys.stderr.write(f"quantdbg fallback: error: {plan.message}\n")
        return 2
    return 0
