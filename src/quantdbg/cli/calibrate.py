"""``quantdbg calibrate``: calibrate an FP32 model and write its INT8 Q/DQ version."""
from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from quantdbg._io import commit_together
from quantdbg.calibration import PercentileConfig, available_calibrators
from quantdbg.calibration.calibrators.base import calibrator_name
from quantdbg.cli._options import (
    add_data_option,
    add_execution_options,
    add_method_option,
    add_model_argument,
    add_out_option,
    add_quant_options,
    executor,
    on_executor,
    quant_config,
    show_progress,
)
from quantdbg.cli._paths import claim_outputs
from quantdbg.cli.app import add_command
from quantdbg.config import CalibConfig
from quantdbg.errors import ConfigError
from quantdbg.qdq import quantize, write_scales_json, write_trt_cache


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Adds the ``calibrate`` subcommand to ``sub``."""
    methods = available_calibrators()
    parser = add_command(
        sub, "calibrate", run, help="Calibrate an FP32 ONNX model and write its INT8 Q/DQ model.",
        description="Calibrate an FP32 ONNX model on representative inputs and write the Q/DQ model "
                    "TensorRT builds with explicit quantization.")
    add_model_argument(parser, help="FP32 .onnx model (never modified).")
    add_data_option(parser, required=True, help=".npz mapping each model input name to its samples (axis 0).")
    add_method_option(parser, metavar="{" + ",".join(methods) + "}",
                      help=f"Default calibrator for activations ({', '.join(methods)}, or a plugin "
                           "calibrator; default: entropy).")
    add_out_option(parser, metavar="OUT.onnx", help="Where to write the Q/DQ model.")
    parser.add_argument("--batch-size", type=int, default=32, metavar="N",
                        help="Samples per calibration batch (scales do not depend on it; default 32).")
    # trtexec reads this file as --calib, Polygraphy as --calibration-cache.
    parser.add_argument("--cache", "--calibration-cache", "--calib", metavar="FILE",
                        help="Also write a TensorRT calibration cache.")
    parser.add_argument("--scales", metavar="FILE.json", help="Also write every scale as JSON.")
    add_quant_options(parser)
    parser.add_argument("--percentile", type=float, metavar="P",
                        help="Percentile kept by the percentile calibrator, in (50, 100] (default 99.99).")
    parser.add_argument("--per-op", nargs="+", default=[], metavar="OP=METHOD",
                        help="Calibrator for activations read by an op type, e.g. Conv=entropy.")
    parser.add_argument("--per-tensor", nargs="+", default=[], metavar="GLOB=METHOD",
                        help="Calibrator for tensors matching a name glob, e.g. '*/head/*=percentile'.")
    parser.add_argument("--bias-correction", action="store_true",
                        help="Subtract from each quantized layer's bias the mean shift INT8 weight rounding "
                             "adds to its output channels (one more pass over the data).")
    parser.add_argument("--equalize", action="store_true",
                        help="Cross-layer equalization first: rescale the channels of consecutive Conv/Gemm "
                             "layers so their ranges balance (the FP32 function is unchanged).")
    add_execution_options(parser)


def run(args: argparse.Namespace) -> int:
    """Runs ``quantdbg calibrate`` with parsed arguments.

    Returns:
        0 on success.

    Raises:
        QuantDbgError: Bad input (the CLI prints it as one line and exits 2).
    """
    outputs = {"--out": args.out, "--cache": args.cache, "--scales": args.scales}
    with claim_outputs(args, outputs, models={"--out"}):
        return _calibrate(args, outputs)


def _calibrate(args: argparse.Namespace, outputs: dict[str, str | None]) -> int:
    calib = calib_config(args.method, args.per_op, args.per_tensor, args.percentile)
    calib = replace(calib, bias_correction=args.bias_correction, equalize=args.equalize)
    calib = on_executor(calib, args, executor(args))
    if args.batch_size < 1:
        raise ConfigError(f"--batch-size must be >= 1, got {args.batch_size}.")
    qmodel = quantize(args.model, args.data, calib, quant_config(args), batch_size=args.batch_size,
                      progress=show_progress(args))
    with commit_together(outputs) as staged:
        qmodel.save(staged["--out"])  # the model, its cache and scales appear together or not at all
        _write_scales(qmodel, staged.get("--cache"), staged.get("--scales"))
    written = [str(p) for p in outputs.values() if p is not None]
    result = qmodel.calibration
    assert result is not None  # quantize() always attaches its calibration
    batches = f"{result.n_batches} batch{'es' if result.n_batches != 1 else ''}"
    nodes = f"{len(qmodel.layers)} node{'s' if len(qmodel.layers) != 1 else ''}"
    sys.stdout.write(f"{len(qmodel.records)} Q/DQ pairs on {nodes}, calibrated on "
                     f"{result.n_samples} samples in {batches}; wrote {', '.join(written)}\n")
    return 0


def calib_config(method: str, per_op: Sequence[str], per_tensor: Sequence[str],
                 percentile: float | None) -> CalibConfig:
    """Builds the CalibConfig the command-line options describe.

    Args:
        method: Default calibrator name.
        per_op: ``OP=METHOD`` entries.
        per_tensor: ``GLOB=METHOD`` entries (first match wins, in the order given).
        percentile: Percentile for every use of the ``percentile`` calibrator (None: its default).

    Returns:
        A validated CalibConfig.

    Raises:
        ConfigError: A malformed entry, an unknown calibrator, or ``percentile`` given while no
            option selects the percentile calibrator.
    """
    ops = _pairs("--per-op", "OP=METHOD", per_op)
    tensors = _pairs("--per-tensor", "GLOB=METHOD", per_tensor)
    names = [method, *ops.values(), *tensors.values()]
    for name in names:
        calibrator_name(name)  # ConfigError with suggestions for an unknown name
    if percentile is not None:
        if "percentile" not in names:
            raise ConfigError("--percentile sets the percentile calibrator, but neither --method, --per-op "
                              "nor --per-tensor selects it; add --method percentile or drop --percentile.")
        spec = PercentileConfig(percentile)

        def swap(name: str) -> Any:
            return spec if name == "percentile" else name

        method = swap(method)
        ops = {k: swap(v) for k, v in ops.items()}
        tensors = {k: swap(v) for k, v in tensors.items()}
    return CalibConfig(method=method, per_op=ops, per_tensor=tensors)


def _pairs(option: str, form: str, entries: Sequence[str]) -> dict[str, str]:
    pairs: dict[str, str] = {}
    for entry in entries:
        key, sep, value = entry.partition("=")
        if not sep or not key or not value:
            raise ConfigError(f"{option} expects {form}, got {entry!r}.")
        pairs[key] = value
    return pairs


def _write_scales(qmodel: Any, cache: Path | None, scales: Path | None) -> list[str]:
    """Writes the TensorRT calibration cache (its header names the calibration) and the JSON scales
    file when asked for."""
    if cache is None and scales is None:
        return []
    written = []
    if cache is not None:
        write_trt_cache(qmodel, cache)
        written.append(str(cache))
    if scales is not None:
        write_scales_json(qmodel, scales)
        written.append(str(scales))
    return written
