"""What several subcommands share: the model / data / metric options of
``analyze`` and ``fallback`` with the API objects they turn into."""
from __future__ import annotations

import argparse
from typing import Any

from quantdbg.config import CalibConfig, QuantConfig
from quantdbg.data import as_model_data, read_npz
from quantdbg.errors import ConfigError, DataError, ModelError
from quantdbg.evaluation import METRIC_NAMES, Accuracy, CommandMetric, OutputMetric, Top1Agreement
from quantdbg.model import as_loaded, quantized_nodes
from quantdbg.qdq import quantize, records_from_model

TOP1 = "top1"
"""The ``--metric`` choice for top-1 agreement with FP32 (:class:`~quantdbg.evaluation.Top1Agreement`)."""
READY_METRICS: tuple[str, ...] = (*METRIC_NAMES, TOP1)
"""``--metric`` choices: every output metric of :mod:`quantdbg.evaluation`, then top-1 agreement."""


def add_model_options(parser: argparse.ArgumentParser) -> None:
    """Adds MODEL and the data, quantization and metric options ``analyze`` and ``fallback`` share."""
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
        return as_loaded(args.fp32), records_from_model(loaded)
    if args.fp32:
        raise ConfigError(f"--fp32 is only for a Q/DQ MODEL, but {args.model!r} holds no Q/DQ nodes; "
                          "drop --fp32.")
    if not args.data:
        raise ConfigError(f"MODEL {args.model!r} is FP32: give calibration data with --data CALIB.npz to "
                          "quantize it.")
    quant = QuantConfig(op_types=tuple(args.op_types)) if args.op_types else QuantConfig()
    qmodel = quantize(loaded, args.data, CalibConfig(method=args.method), quant, batch_size=args.batch_size,
                      progress=args.progress)
    return loaded, qmodel


def task_metric(args: argparse.Namespace) -> Any:
    """The metric the options select: --evaluate's command, --labels' accuracy, or --metric.

    Raises:
        ConfigError: Contradicting options.
        DataError: The --labels array is missing.
    """
    if args.lower_is_better and not args.evaluate:
        raise ConfigError("--lower-is-better describes the --evaluate command's metric; add --evaluate CMD.")
    if args.evaluate and args.labels:
        raise ConfigError("--evaluate and --labels both define the task metric; give only one.")
    if args.evaluate:
        return CommandMetric(args.evaluate, higher_is_better=not args.lower_is_better)
    if args.labels:
        return Accuracy(_labels(args.eval, args.labels))
    return Top1Agreement() if args.metric == TOP1 else OutputMetric(args.metric)


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
