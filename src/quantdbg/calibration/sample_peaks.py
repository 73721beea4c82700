"""Ranges one sample blows up: corrupt values beyond float16's range are refused, large ranges and
ranges one sample alone sets are named.

INT8 does not care about scale, so a tensor that is merely large quantizes well; what ruins it are a
few values that dwarf the rest, so that its scale rounds most values to 0. Beyond float16's range
(65504), where no FP16 fallback can hold them either, such values are the mark of corrupt data (a
``3e38``; :func:`~quantdbg.quant_math.outliers_zero_the_rest`) and calibration refuses them, naming
the tensor, the sample (from its :attr:`~quantdbg.calibration.stats.TensorStats.peaks`) and what to
do, or the initializer upstream that produces them. A tensor beyond float16's range whose values
are of one scale is named in a warning (its layers cannot fall back to FP16), and so is a range one
sample alone sets so wide that every other sample quantizes to 0.
"""
from __future__ import annotations

import warnings
from collections.abc import Iterator, Mapping

import onnx

from quantdbg.calibration.calibrators.base import TensorRange
from quantdbg.calibration.stats import TensorStats
from quantdbg.errors import DataError, ModelError, QuantDbgWarning
from quantdbg.model.external import tensor_array
from quantdbg.model.weights import corrupt_values
from quantdbg.quant_math import FP16_MAX, QMAX, ZEROING_FACTOR, outliers_zero_the_rest

_FLOATS = frozenset({onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE,
                     onnx.TensorProto.BFLOAT16})


def check_beyond_fp16(stats: Mapping[str, TensorStats], model: onnx.ModelProto) -> None:
    """Refuses statistics whose few values beyond float16's range would round the rest to 0; warns for
    the others beyond it.

    Args:
        stats: Tensor name -> statistics, in graph order (the first refused tensor is named).
        model: The model they were collected on (its initializers are read only to explain a refusal).

    Raises:
        ModelError: An initializer computing the tensor holds NaN/Inf or such values itself (the
            initializer and its node are named).
        DataError: Otherwise: the tensor, the value, the sample(s) and what to do are named.

    Warns:
        QuantDbgWarning: A tensor that is merely large: beyond float16's range, but not refused.
    """
    beyond = [s for s in stats.values() if s.absmax > FP16_MAX]
    corrupt = [s for s in beyond if outliers_zero_the_rest(
        s.absmax, -1.0 if s.fp16_absmax is None else s.fp16_absmax, s.beyond_fp16, s.count - s.beyond_fp16)]
    if corrupt:
        _refuse_initializer_upstream(model, corrupt[0])
        more = f" {len(corrupt) - 1} more tensor(s) hold such values too." if len(corrupt) > 1 else ""
        raise DataError(_corrupt_message(corrupt[0]) + more)
    for s in beyond:
        where = f" (the most in sample {s.peaks[0].sample})" if s.peaks else ""
        warnings.warn(f"Tensor {s.name!r} reaches {s.absmax:.3g} during calibration{where}, beyond "
                      f"float16's range (+-{FP16_MAX:g}): INT8 holds it, but the layers reading it would "
                      "overflow in FP16; keep them in FP32 if they leave INT8.", QuantDbgWarning,
                      stacklevel=3)


def _corrupt_message(stats: TensorStats) -> str:
    samples = [p.sample for p in stats.peaks if p.absmax > FP16_MAX]
    if len(samples) == 1:
        where = f", in sample {samples[0]} alone (counted from 0)"
        fix = f"Remove or clip sample {samples[0]}, or check the preprocessing."
    else:
        where = (f", in samples {samples[0]} and {samples[1]} at least (counted from 0)" if samples
                 else " (its values cannot be told apart by sample)")
        fix = "Remove or clip those samples, or check the preprocessing."
    within = stats.count - stats.beyond_fp16
    return (f"Tensor {stats.name!r} reaches {stats.absmax:.3g} during calibration{where}, beyond float16's "
            f"range (+-{FP16_MAX:g}) and more than {ZEROING_FACTOR} times its {within} other values (at most "
            f"{stats.fp16_absmax:.3g}): its INT8 scale would be {stats.absmax / QMAX:.3g}, which rounds all "
            f"of them to 0, and an FP16 fallback would overflow. {fix}")


def _refuse_initializer_upstream(model: onnx.ModelProto, stats: TensorStats) -> None:
    """Raises ModelError for the first (graph order) float initializer computing ``stats.name`` whose
    values are corrupt (:func:`~quantdbg.model.weights.corrupt_values`); reads nothing but those
    initializers."""
    inits = {init.name: init for init in model.graph.initializer if init.data_type in _FLOATS}
    for node in _ancestors(model.graph, stats.name):
        for name in (i for i in node.input if i in inits):
            problem = corrupt_values(tensor_array(inits[name]))
            if problem is not None:
                raise ModelError(f"Tensor {stats.name!r} reaches {stats.absmax:.3g} during calibration "
                                 f"because initializer {name!r} of node {node.name!r} holds {problem}. Fix "
                                 "the model's weights (re-export it) before quantizing.")


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
    other sample quantizes to 0 (the range exceeds :data:`ZEROING_FACTOR` times their max |x|).

    Args:
        stats: Tensor name -> statistics (with peaks).
        ranges: Tensor name -> the range chosen from them.
    """
    for name, chosen in ranges.items():
        peaks = stats[name].peaks if name in stats else ()
        if len(peaks) < 2 or peaks[1].absmax <= 0 or chosen.amax <= ZEROING_FACTOR * peaks[1].absmax:
            continue
        first, second = peaks
        warnings.warn(f"Tensor {name!r}: sample {first.sample} alone sets its range ({chosen.amax:.3g}, "
                      f"{chosen.method}); every other sample stays within {second.absmax:.3g}, below "
                      f"1/{ZEROING_FACTOR} of it, so all of their values quantize to 0. Remove or clip "
                      f"sample {first.sample}, check the preprocessing, or choose a calibrator that clips "
                      "outliers (percentile, entropy, mse).", QuantDbgWarning, stacklevel=3)
