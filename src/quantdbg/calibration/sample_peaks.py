"""Ranges one sample blows up: activations beyond float16's range are refused, ranges one sample
alone sets are named.

A value beyond float16's range (65504) in calibration makes an INT8 scale that rounds every ordinary
value to 0, and no FP16 fallback can hold it either, so calibration refuses it, naming the tensor,
the sample (from its :attr:`~quantdbg.calibration.stats.TensorStats.peaks`) and what to do; when an
initializer upstream holds such a value (or NaN/Inf), that initializer is named instead. Below it,
one sample can still set a range so wide that every other sample quantizes to 0 (more than
:data:`~quantdbg.quant_math.ONE_SAMPLE_FACTOR` times their values): a warning names it.
"""
from __future__ import annotations

import warnings
from collections.abc import Iterator, Mapping

import numpy as np
import onnx

from quantdbg.calibration.calibrators.base import TensorRange
from quantdbg.calibration.stats import TensorStats
from quantdbg.errors import DataError, ModelError, QuantDbgWarning
from quantdbg.model import tensor_array
from quantdbg.quant_math import FP16_MAX, ONE_SAMPLE_FACTOR, QMAX

_FLOATS = frozenset({onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE,
                     onnx.TensorProto.BFLOAT16})


def refuse_beyond_fp16(stats: Mapping[str, TensorStats], model: onnx.ModelProto) -> None:
    """Refuses calibration statistics holding a value beyond float16's range.

    Args:
        stats: Tensor name -> statistics, in graph order (the first such tensor is named).
        model: The model they were collected on (its initializers are read only to explain a refusal).

    Raises:
        ModelError: An initializer computing the tensor holds NaN/Inf or a value beyond float16's
            range (the initializer and its node are named).
        DataError: Otherwise: the tensor, the value, the sample(s) and what to do are named.
    """
    over = [s for s in stats.values() if s.absmax > FP16_MAX]
    if not over:
        return
    _refuse_initializer_upstream(model, over[0])
    more = f" {len(over) - 1} more tensor(s) exceed it too." if len(over) > 1 else ""
    raise DataError(_beyond_message(over[0]) + more)


def _beyond_message(stats: TensorStats) -> str:
    samples = [p.sample for p in stats.peaks if p.absmax > FP16_MAX]
    if len(samples) == 1:
        where = f", in sample {samples[0]} alone (counted from 0)"
        fix = f"Remove or clip sample {samples[0]}, or check the preprocessing."
    else:
        where = (f", in samples {samples[0]} and {samples[1]} at least (counted from 0)" if samples
                 else " (its values cannot be told apart by sample)")
        fix = "Check the preprocessing, or keep the nodes reading it out of INT8 (exclude them)."
    return (f"Tensor {stats.name!r} reaches {stats.absmax:.3g} during calibration, beyond float16's range "
            f"(+-{FP16_MAX:g}){where}: its INT8 scale would be {stats.absmax / QMAX:.3g}, which rounds every "
            f"ordinary value to 0, and an FP16 fallback would overflow. {fix}")


def _refuse_initializer_upstream(model: onnx.ModelProto, stats: TensorStats) -> None:
    """Raises ModelError for the first (graph order) float initializer computing ``stats.name`` that
    holds NaN/Inf or a value beyond float16's range; reads nothing but those initializers."""
    inits = {init.name: init for init in model.graph.initializer if init.data_type in _FLOATS}
    for node in _ancestors(model.graph, stats.name):
        for name in (i for i in node.input if i in inits):
            values = np.asarray(tensor_array(inits[name]), np.float64)
            bad = int(np.count_nonzero(~np.isfinite(values)))
            top = float(np.abs(values[np.isfinite(values)]).max(initial=0.0))
            if bad or top > FP16_MAX:
                held = f"{bad} NaN/Inf value(s)" if bad else f"{top:.3g}, beyond float16's range"
                raise ModelError(f"Tensor {stats.name!r} reaches {stats.absmax:.3g} during calibration "
                                 f"because initializer {name!r} of node {node.name!r} holds {held}. Fix the "
                                 "model's weights (re-export it).")


def _ancestors(graph: onnx.GraphProto, tensor: str) -> Iterator[onnx.NodeProto]:
    """The nodes computing ``tensor``, in graph order."""
    producer = {out: i for i, node in enumerate(graph.node) for out in node.output if out}
    found: set[int] = set()
    stack = [tensor]
    while stack:
        index = producer.get(stack.pop())
        if index is not None and index not in found:
            found.add(index)
            stack.extend(graph.node[index].input)
    return (graph.node[i] for i in sorted(found))


def warn_one_sample_ranges(stats: Mapping[str, TensorStats], ranges: Mapping[str, TensorRange]) -> None:
    """Warns (QuantDbgWarning) for each range one sample alone sets, so wide that every value of every
    other sample quantizes to 0 (the range exceeds :data:`ONE_SAMPLE_FACTOR` times their max |x|).

    Args:
        stats: Tensor name -> statistics (with peaks).
        ranges: Tensor name -> the range chosen from them.
    """
    for name, chosen in ranges.items():
        peaks = stats[name].peaks if name in stats else ()
        if len(peaks) < 2 or peaks[1].absmax <= 0 or chosen.amax <= ONE_SAMPLE_FACTOR * peaks[1].absmax:
            continue
        first, second = peaks
        warnings.warn(f"Tensor {name!r}: sample {first.sample} alone sets its range ({chosen.amax:.3g}, "
                      f"{chosen.method}); every other sample stays within {second.absmax:.3g}, below "
                      f"1/{ONE_SAMPLE_FACTOR} of it, so all of their values quantize to 0. Remove or clip "
                      f"sample {first.sample}, check the preprocessing, or choose a calibrator that clips "
                      "outliers (percentile, entropy, mse).", QuantDbgWarning, stacklevel=3)
