"""Q/DQ removal: layers excluded from INT8 (the FP16/FP32 fallback) lose their pairs."""
from __future__ import annotations

import warnings
from collections.abc import Iterable

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from quantdbg.calibration.bias_correction import BiasCorrection, restore_bias
from quantdbg.config import Precision
from quantdbg.errors import ModelError, QuantDbgWarning
from quantdbg.model.graph import constant_values, is_float, to_graph, to_model
from quantdbg.model.names import UniqueNames
from quantdbg.qdq.insert import check_names
from quantdbg.qdq.records import QdqRecord, QuantizedModel
from quantdbg.quant_math import FP16_MAX

# Ops whose output is never negative: a zero-clamping Q/DQ after them needs no Relu once removed.
_NON_NEGATIVE_OPS = frozenset({"Relu", "Sigmoid", "Softmax", "Abs", "Exp", "Sqrt"})


def remove_qdq(qmodel: QuantizedModel, exclude: Iterable[str],
               precision: Precision = Precision.FP16) -> QuantizedModel:
    """Keeps the ``exclude`` nodes out of INT8: their Q/DQ pairs go, and they compute in FP16 or FP32.

    Each input of an excluded node is wired back to its FP32 tensor (a weight stored as INT8 is
    replaced by its dequantized FP32 constant), and a bias corrected for its INT8 weights gets its
    FP32 values back. With FP16, float inputs are cast to float16
    (initializers converted once, ahead of time) and float outputs cast back to float32 under
    their original names, so the rest of the graph is untouched. Other nodes keep their pairs.

    On ONNX Runtime's CPU provider FP16 graphs run, but on x86 it has no float16 Conv, MatMul,
    Gemm or Add kernels: it inserts casts and computes those nodes in float32 from the
    float16-rounded inputs and weights (rounding the output to float16 again). That models
    FP16 storage, not FP16 accumulation; choose FP32 when a CPU reference run should be exact.

    A removed activation pair whose zero point is the lowest code (as ONNX Runtime writes after
    deleting a Relu it considers redundant) also clamped negatives to zero; a Relu takes over
    that clamp so the node still sees what it saw before.

    Args:
        qmodel: A Q/DQ model from :func:`insert_qdq` or :func:`records_from_model`.
        exclude: Quantized node names to keep out of INT8.
        precision: FP16 (what TensorRT would run) or FP32 (exact, for CPU reference runs).

    Returns:
        A new QuantizedModel without those nodes' records; ``excluded`` lists every node
        excluded so far, ``excluded_precision`` is ``precision``.

    Raises:
        ModelError: A name is not a quantized node of ``qmodel`` (close names are suggested), or
            the model no longer matches its records.
    """
    precision = Precision(precision)
    chosen = list(dict.fromkeys(exclude))
    check_names("quantized node", chosen, qmodel.layers)
    graph = to_graph(qmodel.model)
    by_name = {node.name: node for node in graph.nodes}
    names = UniqueNames.of_graph(graph)
    for name in chosen:
        node = by_name.get(name)
        if node is None:
            raise ModelError(f"Node {name!r} has Q/DQ records but is not in the model; the records "
                             "and the model disagree. Rebuild them with records_from_model().")
        for record in qmodel.records_of(name):
            node.inputs[record.input_index] = _fp32_source(graph, node, record, names)
        correction = _bias_correction(qmodel, name)
        if correction is not None:  # the corrected bias belongs to the INT8 weights
            restore_bias(graph, correction, names)
        if precision is Precision.FP16:
            _to_fp16(graph, node, names)
    # No onnx.checker pass here: sweeps call this once per variant, and on a 90 MB model the
    # checker's serialisation would cost twice the edit itself (the tests check the results).
    model = to_model(graph, like=qmodel.model)
    kept = tuple(r for r in qmodel.records if r.node not in set(chosen))
    return QuantizedModel(model, kept, qmodel.calibration, qmodel.excluded + tuple(chosen), precision)


def _bias_correction(qmodel: QuantizedModel, layer: str) -> BiasCorrection | None:
    corrections = qmodel.calibration.bias_correction if qmodel.calibration is not None else None
    return corrections.of(layer) if corrections is not None else None


def _fp32_source(graph: gs.Graph, node: gs.Node, record: QdqRecord, names: UniqueNames) -> gs.Tensor:
    """The FP32 tensor behind the DequantizeLinear feeding ``node`` at ``record.input_index``."""
    fed = node.inputs[record.input_index]
    dq = fed.inputs[0] if len(fed.inputs) == 1 else None
    if dq is None or dq.op != "DequantizeLinear" or dq.name != record.dequantize_node:
        raise ModelError(f"Input {record.input_index} of node {record.node!r} is not produced by "
                         f"DequantizeLinear {record.dequantize_node!r} as its record says; the model "
                         "was edited after quantization. Rebuild the records with records_from_model().")
    source = dq.inputs[0]
    producer = source.inputs[0] if len(source.inputs) == 1 else None
    if producer is not None and producer.op == "QuantizeLinear":
        fp = producer.inputs[0]
        if _clamps_at_zero(dq) and not (len(fp.inputs) == 1 and fp.inputs[0].op in _NON_NEGATIVE_OPS):
            fp = _relu(graph, fp, f"{node.name}/input{record.input_index}", names)
        return fp
    values = constant_values(source)
    if values is None:
        raise ModelError(f"DequantizeLinear {dq.name!r} feeding node {record.node!r} reads "
                         f"{source.name!r}, which is neither a QuantizeLinear output nor a constant; "
                         "cannot recover its FP32 values.")
    return gs.Constant(names(f"{source.name}/dequantized"), _dequantize(dq, values))


def _clamps_at_zero(dq: gs.Node) -> bool:
    """True when the pair's zero point is the lowest code, so it maps every negative value to 0.

    ONNX Runtime's quantizer deletes a Relu whose output gets such a pair (the clamp does the
    Relu's work), so removing the pair must put the clamp back.
    """
    zp = constant_values(dq.inputs[2]) if len(dq.inputs) > 2 and dq.inputs[2].name else None
    if zp is None or zp.dtype not in (np.int8, np.uint8):
        return False
    return bool(np.all(zp == np.iinfo(zp.dtype).min))


def _relu(graph: gs.Graph, tensor: gs.Tensor, base: str, names: UniqueNames) -> gs.Variable:
    out = gs.Variable(names(f"{base}/clamped"), tensor.dtype, tensor.shape)
    graph.nodes.append(gs.Node("Relu", names(f"{base}/Relu"), inputs=[tensor], outputs=[out]))
    return out


def _dequantize(dq: gs.Node, values: np.ndarray) -> np.ndarray:
    """NumPy DequantizeLinear: ``(x - zero_point) * scale`` in float32, per axis when 1-D scale."""
    scale = constant_values(dq.inputs[1])
    if scale is None:
        raise ModelError(f"DequantizeLinear {dq.name!r} has a computed scale; cannot dequantize its weight.")
    zp = constant_values(dq.inputs[2]) if len(dq.inputs) > 2 and dq.inputs[2].name else None
    zp = np.zeros_like(scale, np.int32) if zp is None else zp.astype(np.int32)
    scale = scale.astype(np.float32)
    if scale.ndim == 1 and scale.size > 1:
        axis = int(dq.attrs.get("axis", 1)) % values.ndim
        shape = [1] * values.ndim
        shape[axis] = scale.size
        scale, zp = scale.reshape(shape), zp.reshape(shape)
    return ((values.astype(np.int32) - zp).astype(np.float32) * scale).astype(np.float32)


def _to_fp16(graph: gs.Graph, node: gs.Node, names: UniqueNames) -> None:
    """Makes ``node`` compute in float16 between casts; weights become float16 initializers."""
    for index, tensor in enumerate(node.inputs):
        if not tensor.name or not is_float(tensor):
            continue
        if isinstance(tensor, gs.Constant):
            node.inputs[index] = gs.Constant(names(f"{tensor.name}/fp16"), _half(tensor, node.name))
            continue
        cast_out = gs.Variable(names(f"{node.name}/input{index}/fp16"), np.float16, tensor.shape)
        graph.nodes.append(gs.Node("Cast", names(f"{node.name}/input{index}/Cast_fp16"),
                                   {"to": onnx.TensorProto.FLOAT16}, inputs=[tensor], outputs=[cast_out]))
        node.inputs[index] = cast_out
    for index, tensor in enumerate(list(node.outputs)):
        if not is_float(tensor):
            continue
        half = gs.Variable(names(f"{tensor.name}/fp16"), np.float16, tensor.shape)
        node.outputs[index] = half
        graph.nodes.append(gs.Node("Cast", names(f"{node.name}/output{index}/Cast_fp32"),
                                   {"to": onnx.TensorProto.FLOAT}, inputs=[half], outputs=[tensor]))


def _half(constant: gs.Constant, node: str) -> np.ndarray:
    """float16 copy of an initializer, saturated (not turned into inf) beyond float16's range."""
    values = np.asarray(constant_values(constant), np.float32)
    limit = FP16_MAX
    if np.any(np.abs(values[np.isfinite(values)]) > limit):
        warnings.warn(f"Initializer {constant.name!r} of node {node!r} holds values beyond float16's "
                      f"range (+-{limit:g}); they are clipped in the FP16 fallback. Keep this node in "
                      "FP32 (precision=Precision.FP32) if that matters.", QuantDbgWarning, stacklevel=4)
    return np.clip(values, -limit, limit).astype(np.float16)
