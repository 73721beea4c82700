"""NNCF's ``quantize_with_accuracy_control`` on one zoo model file, as benchmarks/auto.py measures it.

Runs in the NNCF venv (benchmarks/setup_nncf.sh), one process per run, started by auto.py:

    $NNCF_PYTHON benchmarks/_nncf_peer.py NAME MODEL.onnx MAX_REL_LOSS WORK --result OUT.json

The harness is the one NNCF documents: a calibration ``nncf.Dataset`` of every calibration sample
(the samples quantdbg calibrates on), a validation ``nncf.Dataset`` whose items are the scored items
of the evaluation set (one image or strip, one query/paragraph pair, one clip), and a validation
function that runs the model it is given with ONNX Runtime (Q/DQ computed as ONNX defines it, one
thread, the runtime quantdbg evaluates with) on exactly the items it is given and returns the task
metric of those items and, when the metric is a mean over items, each item's value (else None, and
NNCF scores items one at a time itself). The target is NNCF's relative drop (``DropType.RELATIVE``,
``max_drop`` = the same fraction as quantdbg's target); everything else is NNCF's default, except
``model_type=TRANSFORMER`` for the transformer, as NNCF's documentation asks, and the ranking
subset held at NNCF's default 300 items (NNCF ties it to ``subset_size``, set here to every
calibration sample).

Recorded: every call of the validation function (items, metric, seconds, and who called it: the
mode probe, the FP32/INT8 baselines, the ranking, the per-item collection, the revert loop), NNCF's
own report of the groups it reverted, and which Conv/ConvTranspose/Gemm/MatMul nodes compute in INT8
(both inputs read through DequantizeLinear) in NNCF's INT8 model and in its final model.

TensorRT builds INT8 Q/DQ with zero point 0 only, and NNCF quantizes most activations (those after a
ReLU) to UINT8. So each of NNCF's two models is also scored in TensorRT's form (:func:`trt_form`:
every such Q/DQ pair made INT8 with zero point 0 over the same clipping range), outside NNCF's run
like the final check, with the count of its QuantizeLinear nodes that are not INT8.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _bench import pin_ort_threads  # noqa: E402
from _zoo_tasks import bench_task, score_items, task_items  # noqa: E402

LAYER_OPS = ("Conv", "ConvTranspose", "Gemm", "MatMul")
# Ops an INT8 tensor passes through unchanged (NNCF's quantize-agnostic ONNX operations, plus Cast):
# a layer behind DequantizeLinear -> MaxPool -> Reshape reads INT8 data.
PASS_THROUGH = ("MaxPool", "GlobalMaxPool", "ReduceMax", "Reshape", "Transpose", "Squeeze", "Unsqueeze",
                "Split", "Tile", "CenterCropPad", "Slice", "Pad", "Gather", "GatherND", "GatherElements",
                "DepthToSpace", "SpaceToDepth", "CastLike", "Dropout", "Flatten", "Expand", "Identity",
                "Concat", "Cast")
PHASES = (("determine_mode", "mode probe"), ("_calculate_ranking_score", "rank"),
          ("collect_values_for_each_item_using_prepared_model", "per-item"),
          ("collect_metric_results", "baseline"), ("_apply", "revert"))
ROWS_PER_RUN = 32
UNCOUNTED = ("final check", "trt form check")  # validations run after NNCF's, not part of its cost
# The integer range of each Q/DQ type (ONNX element types); TensorRT's INT8 is symmetric, zero point 0.
QRANGE = {TensorProto.UINT8: (0, 255), TensorProto.INT8: (-128, 127), TensorProto.UINT16: (0, 65535),
          TensorProto.INT16: (-32768, 32767)}
INT8_MAX = 127


class Validation:
    """NNCF's validation function for one task, and the log of its calls."""

    def __init__(self, name: str, stack: bool) -> None:
        self.name = name
        self.stack = stack  # items may be stacked on axis 0 into one run (not Silero's clips with state)
        self.calls: list[dict[str, Any]] = []
        self._session: tuple[Any, Any] | None = None

    def session(self, model: Any) -> Any:
        """One ONNX Runtime session per model object (NNCF scores one model item by item too)."""
        import onnxruntime as ort

        if self._session is None or self._session[0] is not model:
            options = ort.SessionOptions()
            options.intra_op_num_threads = options.inter_op_num_threads = 1
            options.log_severity_level = 3
            options.add_session_config_entry("session.disable_quant_qdq", "1")  # Q/DQ as ONNX defines it
            self._session = (model, ort.InferenceSession(model.SerializeToString(), options,
                                                         providers=["CPUExecutionProvider"]))
        return self._session[1]

    def outputs(self, session: Any, feeds: list[dict[str, np.ndarray]]) -> list[np.ndarray]:
        """Each item's first output; stackable items run ROWS_PER_RUN rows at a time."""
        if not self.stack:
            return [session.run(None, feed)[0] for feed in feeds]
        rows = len(next(iter(feeds[0].values())))
        per_run = max(1, ROWS_PER_RUN // rows)
        out: list[np.ndarray] = []
        for i in range(0, len(feeds), per_run):
            chunk = feeds[i:i + per_run]
            batch = session.run(None, {k: np.concatenate([f[k] for f in chunk]) for k in chunk[0]})[0]
            out.extend(np.split(batch, len(chunk)))
        return out

    def __call__(self, model: Any, items: Any) -> tuple[float, list[float] | None]:
        start = time.perf_counter()
        items = list(items)
        outs = self.outputs(self.session(model), [feed for feed, _ in items])
        metric, values = score_items(self.name, outs, [label for _, label in items])
        self.calls.append({"phase": _caller(), "items": len(items), "metric": metric,
                           "seconds": round(time.perf_counter() - start, 4)})
        return metric, values


def _caller() -> str:
    """Which step of NNCF's algorithm called the validation function (read off the call stack)."""
    frame = sys._getframe(2)
    names = []
    while frame is not None and len(names) < 20:
        names.append(frame.f_code.co_name)
        frame = frame.f_back
    return next((phase for code, phase in PHASES if code in names), "other")


def int8_layers(model: Any) -> dict[str, bool]:
    """Per Conv/ConvTranspose/Gemm/MatMul node: whether its data and weight inputs are both read
    through DequantizeLinear (through :data:`PASS_THROUGH` nodes): the layers TensorRT runs in INT8.
    The one count both tools' models are judged by."""
    producer = {out: node for node in model.graph.node for out in node.output}

    def dequantized(tensor: str) -> bool:
        node = producer.get(tensor)
        while node is not None and node.op_type in PASS_THROUGH:
            node = producer.get(node.input[0])
        return node is not None and node.op_type == "DequantizeLinear"

    return {node.name: all(dequantized(t) for t in node.input[:2])
            for node in model.graph.node if node.op_type in LAYER_OPS}


def _initializer(node: Any, index: int, inits: dict[str, Any]) -> np.ndarray:
    name = node.input[index]
    if name not in inits:
        role = "scale" if index == 1 else "zero point"
        raise ValueError(f"{node.op_type} {node.name!r}: its {role} {name!r} is not an initializer; the "
                         "TensorRT-form rewrite reads Q/DQ parameters from initializers only (fold "
                         "Constant nodes into initializers first, e.g. onnx-graphsurgeon's fold_constants).")
    return numpy_helper.to_array(inits[name])


def _qparams(node: Any, inits: dict[str, Any]) -> tuple[np.ndarray, np.ndarray, int]:
    """A Q/DQ node's scale, zero point (int64) and integer type. Without a zero point the type is the
    ``output_dtype`` attribute's, else UINT8, as ONNX defines it."""
    scale = _initializer(node, 1, inits)
    if len(node.input) > 2 and node.input[2]:
        return scale, _initializer(node, 2, inits).astype(np.int64), inits[node.input[2]].data_type
    attr = next((a.i for a in node.attribute if a.name == "output_dtype" and a.i), TensorProto.UINT8)
    return scale, np.zeros((), np.int64), attr


def _needs_rewrite(zero_point: np.ndarray, qtype: int) -> bool:
    if qtype not in QRANGE:
        raise ValueError(f"Q/DQ type {TensorProto.DataType.Name(qtype)} has no TensorRT-form rewrite "
                         f"(known: {', '.join(TensorProto.DataType.Name(t) for t in QRANGE)}).")
    return qtype != TensorProto.INT8 or bool(zero_point.any())


def quantizer_types(model: Any) -> dict[str, Any]:
    """How many QuantizeLinear nodes quantize to each integer type, and how many not to INT8."""
    inits = {i.name: i for i in model.graph.initializer}
    types = [_qparams(n, inits)[2] for n in model.graph.node if n.op_type == "QuantizeLinear"]
    names = [TensorProto.DataType.Name(t) for t in types]
    return {"total": len(types), "non_int8": sum(t != TensorProto.INT8 for t in types),
            "by_type": {name: names.count(name) for name in sorted(set(names))}}


def _trt_pair(q: Any, dqs: list[Any], inits: dict[str, Any]) -> list[Any]:
    """The INT8 zero-point-0 scale and zero point of one Q/DQ pair, checked to be a pair."""
    scale, zero_point, qtype = _qparams(q, inits)
    if not dqs or any(n.op_type != "DequantizeLinear" for n in dqs):
        raise ValueError(f"QuantizeLinear {q.name!r}: its output {q.output[0]!r} is not read by "
                         "DequantizeLinear nodes only; the TensorRT-form rewrite needs Q/DQ pairs.")
    for dq in dqs:
        dq_scale, dq_zero, dq_type = _qparams(dq, inits)
        if dq_type != qtype or not (np.array_equal(dq_scale, scale) and np.array_equal(dq_zero, zero_point)):
            raise ValueError(f"DequantizeLinear {dq.name!r} does not use the scale, zero point and type "
                             f"of its QuantizeLinear {q.name!r}; the rewrite needs matching pairs.")
    lo, hi = QRANGE[qtype]
    # The same clipping range, symmetric: the largest magnitude either side of the zero point.
    wide = np.maximum(zero_point - lo, hi - zero_point).astype(np.float64)
    new_scale = (scale.astype(np.float64) * wide / INT8_MAX).astype(scale.dtype)
    return [numpy_helper.from_array(new_scale, f"{q.output[0]}_trt_scale"),
            numpy_helper.from_array(np.zeros(new_scale.shape, np.int8), f"{q.output[0]}_trt_zero_point")]


def trt_form(model: Any) -> tuple[Any, int]:
    """``model`` in TensorRT's INT8 form, and how many Q/DQ pairs changed (the model is not modified).

    Each pair whose type is not INT8, or INT8 with a nonzero zero point, becomes INT8 with zero
    point 0 and scale s' = s * max(zp - qmin, qmax - zp) / 127 ((qmin, qmax) the old type's range):
    the same largest magnitude, half the levels for a UINT8 ReLU output. A stored quantized tensor
    read by DequantizeLinear alone would need requantizing and is refused."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph = out.graph
    inits = {i.name: i for i in graph.initializer}
    readers: dict[str, list[Any]] = {}
    for node in graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    quantized = {n.output[0] for n in graph.node if n.op_type == "QuantizeLinear"}
    changed = 0
    for q in [n for n in graph.node if n.op_type == "QuantizeLinear"]:
        dqs = readers.get(q.output[0], [])
        if not _needs_rewrite(*_qparams(q, inits)[1:]):
            continue
        new = _trt_pair(q, dqs, inits)
        if any(t.name in inits for t in new):
            raise ValueError(f"QuantizeLinear {q.name!r}: the model already has a tensor {new[0].name!r}.")
        graph.initializer.extend(new)
        for node in (q, *dqs):
            del node.input[1:]
            node.input.extend([t.name for t in new])
        _drop_attribute(q, "output_dtype")
        _retype(graph, q.output[0])
        changed += 1
    lone = [n for n in graph.node if n.op_type == "DequantizeLinear" and n.input[0] not in quantized
            and _needs_rewrite(*_qparams(n, inits)[1:])]
    if lone:
        raise ValueError(f"DequantizeLinear {lone[0].name!r} reads a stored quantized tensor that is not "
                         "INT8 with zero point 0; the TensorRT-form rewrite handles Q/DQ pairs only.")
    return _without_unread(out), changed


def _retype(graph: Any, tensor: str) -> None:
    """Records ``tensor`` as INT8 wherever the graph states its type (NNCF's models keep value_info)."""
    for info in (*graph.value_info, *graph.output):
        if info.name == tensor:
            info.type.tensor_type.elem_type = TensorProto.INT8


def _drop_attribute(node: Any, name: str) -> None:
    kept = [a for a in node.attribute if a.name != name]
    del node.attribute[:]
    node.attribute.extend(kept)


def _without_unread(model: Any) -> Any:
    """``model`` without the initializers no node reads any more (the replaced scales and zero points)."""
    read = {name for node in model.graph.node for name in node.input}
    kept = [t for t in model.graph.initializer if t.name in read]
    del model.graph.initializer[:]
    model.graph.initializer.extend(kept)
    return model


def trt_check(validation: Validation, model: Any, items: list[Any], metric: float | None
              ) -> tuple[float | None, dict[str, Any]]:
    """The task metric of ``model`` in TensorRT's form (``metric``, its own, when no pair changes),
    scored outside NNCF's run, and the types of its quantizers. A model the rewrite refuses keeps NNCF's
    own measurements: its metric is None and the refusal is recorded."""
    try:
        rewritten, pairs = trt_form(model)
    except ValueError as err:  # one column lost, not the row's NNCF run
        return None, {**quantizer_types(model), "rewritten": 0, "error": str(err)}
    if pairs:
        metric, _ = validation(rewritten, items)
        validation.calls[-1]["phase"] = "trt form check"
    return metric, {**quantizer_types(model), "rewritten": pairs}


def _calibration(task: Any) -> list[dict[str, np.ndarray]]:
    if isinstance(task.calib, list):
        return list(task.calib)
    n = len(next(iter(task.calib.values())))
    return [{k: a[i:i + 1] for k, a in task.calib.items()} for i in range(n)]


def _spy_report(captured: list[Any]) -> None:
    """Keeps NNCF's report of the reverted groups (it only logs it) as it is printed."""
    from nncf.quantization.algorithms.accuracy_control.algorithm import QuantizationAccuracyRestorer

    printed = QuantizationAccuracyRestorer._print_report

    def keep(report: Any, max_num_iterations: int) -> None:
        captured.append(report)
        printed(report, max_num_iterations)

    QuantizationAccuracyRestorer._print_report = staticmethod(keep)


def _spy_quantize(spent: list[float]) -> None:
    """Times NNCF's quantization (calibration, fast bias correction, Q/DQ insertion)."""
    from nncf.onnx.quantization import quantize_model as module

    inner = module.quantize_impl

    def timed(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            spent.append(time.perf_counter() - start)

    module.quantize_impl = timed


def run(name: str, path: Path, max_rel_loss: float, work: Path) -> dict[str, Any]:
    """One accuracy-controlled quantization; the measurements as a JSON-able dict."""
    import nncf
    from nncf.quantization.advanced_parameters import AdvancedAccuracyRestorerParameters

    start = time.perf_counter()
    task = bench_task(name, work / "nncf_task")
    model = onnx.load(str(path))
    calib = _calibration(task)
    items = task_items(task)
    validation = Validation(name, stack=not isinstance(task.eval, list))
    reports: list[Any] = []
    quantize_s: list[float] = []
    _spy_report(reports)
    _spy_quantize(quantize_s)
    final = nncf.quantize_with_accuracy_control(
        model, nncf.Dataset(calib), nncf.Dataset(items, lambda item: item[0]), validation,
        max_drop=max_rel_loss / 100, drop_type=nncf.DropType.RELATIVE, subset_size=len(calib),
        model_type=nncf.ModelType.TRANSFORMER if name == "minilm_l6_v2_text" else None,
        advanced_accuracy_restorer_parameters=AdvancedAccuracyRestorerParameters(
            intermediate_model_dir=str(work), ranking_subset_size=300))
    wall = time.perf_counter() - start
    int8 = onnx.load(str(work / "intermediate_model.onnx"))
    final_metric, _ = validation(final, items)  # scored once more, outside NNCF's run: not counted
    validation.calls[-1]["phase"] = "final check"
    baseline = [c["metric"] for c in validation.calls if c["phase"] == "baseline"]
    int8_trt, int8_types = trt_check(validation, int8, items, baseline[1] if len(baseline) > 1 else None)
    final_trt, final_types = trt_check(validation, final, items, final_metric)
    report = reports[0] if reports else None
    return {"wall_s": round(wall, 2), "quantize_s": round(sum(quantize_s), 2), "calls": validation.calls,
            "n_items": len(items), "final": final_metric, "int8_layers": int8_layers(int8),
            "final_layers": int8_layers(final), "int8_trt": int8_trt, "final_trt": final_trt,
            "uint8_quantizers": {"int8": int8_types, "final": final_types},
            "reverted_groups": [] if report is None else [
                {"operations": [n.node_name for n in g.operations],
                 "quantizers": [n.node_name for n in g.quantizers]} for g in report.removed_groups],
            "nncf_quantized_ops": None if report is None else report.num_quantized_operations}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("name")
    parser.add_argument("model", type=Path)
    parser.add_argument("max_rel_loss", type=float)
    parser.add_argument("work", type=Path)
    parser.add_argument("--result", type=Path, required=True)
    args = parser.parse_args()
    os.environ.setdefault("NNCF_CI", "1")  # no telemetry (the venv has no telemetry package either)
    pin_ort_threads()
    found = run(args.name, args.model, args.max_rel_loss, args.work)
    args.result.write_text(json.dumps({"ok": True, **found}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
