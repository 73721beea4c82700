"""Q/DQ insertion (TensorRT explicit quantization): one QuantizeLinear/DequantizeLinear pair per
planned (node, input), each recorded."""
from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from quantdbg.calibration import CalibrationResult, equalize
from quantdbg.calibration.bias_correction import apply_bias_corrections
from quantdbg.config import QuantConfig, TensorKind
from quantdbg.errors import ModelError, NotCalibratedError, unknown
from quantdbg.model.graph import constant_values, to_graph, to_model
from quantdbg.model.load import ModelSource, as_loaded
from quantdbg.model.names import UniqueNames
from quantdbg.model.staging import check_model
from quantdbg.model.weights import check_weight
from quantdbg.placement import QdqPlan, QuantTarget, plan_qdq
from quantdbg.placement.plan import DEFAULT_QUANT
from quantdbg.qdq.records import WEIGHT_CALIBRATOR, QdqRecord, QuantizedModel
from quantdbg.quant_math import channel_amax, scale_from_amax


def insert_qdq(model: ModelSource, calibration: CalibrationResult,
               config: QuantConfig = DEFAULT_QUANT, *, exclude: Collection[str] = frozenset(),
               plan: QdqPlan | None = None) -> QuantizedModel:
    """Inserts one QuantizeLinear/DequantizeLinear pair per planned (node, input).

    Activations are symmetric per tensor (scale ``amax / 127``, zero point int8 0; a shared-scale
    group uses the largest amax of its members). Weights stay FP32 initializers followed by
    QuantizeLinear -> DequantizeLinear with per-channel scales ``channel amax / 127``, so the
    INT8 values lie in [-127, 127]; TensorRT and ONNX Runtime fold the pair into INT8 weights.
    A calibration made with ``equalize`` is applied to the equalized model, and one with bias
    corrections gives each quantized layer its corrected bias (the excluded ones keep theirs).

    Args:
        model: The FP32 model: path, ModelProto (never modified) or LoadedModel (not re-checked).
        calibration: Activation ranges from :func:`quantdbg.calibrate`.
        config: Placement settings (used to plan when ``plan`` is None).
        exclude: Names of planned nodes to keep out of INT8 (no Q/DQ pairs); exact names, where
            ``config.exclude`` globs keep nodes out of the plan itself.
        plan: A plan from :func:`plan_qdq` (e.g. the one calibration used).

    Returns:
        The Q/DQ model (named nodes, passes onnx.checker) with one record per pair and
        ``calibration`` attached.

    Raises:
        ModelError: The model is invalid or already quantized, an ``exclude`` name is not a
            quantizable node, the plan does not match the model, or a weight holds NaN/Inf or a
            few values beyond float16's range that would round the rest of its channel to 0.
        NotCalibratedError: An activation to quantize has no range in ``calibration``.
    """
    loaded = as_loaded(model)
    if calibration.config.equalize:  # the ranges are those of the equalized model (idempotent)
        loaded = equalize(loaded).model
    fp_model = loaded.proto
    plan = plan if plan is not None else plan_qdq(loaded, config)
    check_names("quantizable node", exclude, plan.layers)
    scales = _activation_scales(plan, calibration, exclude)
    graph = to_graph(fp_model)
    nodes = {node.name: node for node in graph.nodes}
    names = UniqueNames.of_graph(graph)
    records = []
    for target in plan.targets:
        if target.node in exclude:
            continue
        node = _planned_node(nodes, target)
        if target.kind is TensorKind.WEIGHT:
            scale, method = _weight_scale(node.inputs[target.input_index], target), WEIGHT_CALIBRATOR
        else:
            scale, method = scales[target.tensor]
        records.append(_insert_pair(graph, node, target, scale, method, names))
    if calibration.bias_correction is not None:
        apply_bias_corrections(graph, calibration.bias_correction, {r.node for r in records}, names)
    qmodel = to_model(graph, like=fp_model)
    _checked(qmodel)
    return QuantizedModel(qmodel, tuple(records), calibration)


def check_names(kind: str, names: Iterable[str], known: Collection[str]) -> None:
    known_set = set(known)
    for name in names:
        if name not in known_set:
            raise unknown(kind, name, known)


def _activation_scales(plan: QdqPlan, calibration: CalibrationResult,
                       exclude: Collection[str]) -> dict[str, tuple[np.ndarray, str]]:
    """Tensor -> (float32 scale, calibrator) for every activation that gets a pair."""
    needed = {t.tensor: t.node for t in plan.targets
              if t.kind is TensorKind.ACTIVATION and t.node not in exclude}
    scales: dict[str, tuple[np.ndarray, str]] = {}
    for tensor, node in needed.items():
        best_amax, best_method = -1.0, ""
        for member in plan.group_of(tensor):
            rng = calibration.ranges.get(member)
            if rng is None:
                raise NotCalibratedError(
                    f"Activation tensor {member!r} (input of node {node!r}"
                    f"{'' if member == tensor else f', sharing one scale with {tensor!r}'}) has no "
                    "calibrated range. Calibrate with the same QdqPlan/QuantConfig used here "
                    "(quantdbg.calibrate(model, data, config, plan)), or keep the node out of INT8 "
                    f"(insert_qdq(..., exclude=[{node!r}])).")
            if rng.amax > best_amax:
                best_amax, best_method = rng.amax, rng.method
        scales[tensor] = (scale_from_amax(np.float64(best_amax)), best_method)
    return scales



def _planned_node(nodes: Mapping[str, gs.Node], target: QuantTarget) -> gs.Node:
    node = nodes.get(target.node)
    if node is None or len(node.inputs) <= target.input_index \
            or node.inputs[target.input_index].name != target.tensor:
        raise ModelError(
            f"The QdqPlan does not match the model: expected node {target.node!r} to read tensor "
            f"{target.tensor!r} at input {target.input_index}. Build the plan with plan_qdq() on "
            "this same model.")
    return node


def _weight_scale(weight: gs.Tensor, target: QuantTarget) -> np.ndarray:
    if not isinstance(weight, gs.Constant):
        raise ModelError(f"Weight input {target.input_index} ({target.tensor!r}) of node {target.node!r} "
                         "is not an initializer; re-plan with plan_qdq() on this model.")
    values = np.asarray(constant_values(weight), np.float32)
    check_weight(values, target.tensor, target.node, target.axis)
    amax = channel_amax(values, target.axis)
    return scale_from_amax(amax if target.axis is None else amax.reshape(-1))


def _insert_pair(graph: gs.Graph, node: gs.Node, target: QuantTarget, scale: np.ndarray, method: str,
                 names: UniqueNames) -> QdqRecord:
    """One symmetric pair (zero points 0, one per scale) on the target input; its record."""
    zero_point = np.zeros(np.shape(scale), np.int8)
    source = node.inputs[target.input_index]
    base = f"{node.name}/input{target.input_index}"
    attrs = {} if target.axis is None else {"axis": target.axis}
    scale_c = gs.Constant(names(f"{base}/scale"), np.asarray(scale, np.float32))
    zp_c = gs.Constant(names(f"{base}/zero_point"), np.asarray(zero_point, np.int8))
    quantized = gs.Variable(names(f"{base}/quantized"), np.int8, source.shape)
    dequantized = gs.Variable(names(f"{base}/dequantized"), np.float32, source.shape)
    q = gs.Node("QuantizeLinear", names(f"{base}/QuantizeLinear"), dict(attrs),
                inputs=[source, scale_c, zp_c], outputs=[quantized])
    dq = gs.Node("DequantizeLinear", names(f"{base}/DequantizeLinear"), dict(attrs),
                 inputs=[quantized, scale_c, zp_c], outputs=[dequantized])
    graph.nodes.extend([q, dq])
    node.inputs[target.input_index] = dequantized
    return QdqRecord(node.name, node.op, target.input_index, target.tensor, target.kind, q.name, dq.name,
                     tuple(float(s) for s in np.atleast_1d(scale)), target.axis, method,
                     tuple(int(z) for z in np.atleast_1d(zero_point)))


def _checked(model: onnx.ModelProto) -> None:
    try:
        check_model(model)  # by path when the weights are external or past 2 GB
    except onnx.checker.ValidationError as err:  # a bug in quantdbg, not a user error
        raise AssertionError(f"quantdbg produced an invalid ONNX model: {err}") from err


