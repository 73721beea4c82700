"""Records of the Q/DQ pairs in a model quantized elsewhere (ModelOpt, ONNX Runtime's QDQ format)."""
from __future__ import annotations

import warnings

import numpy as np
import onnx_graphsurgeon as gs

from quantdbg.config import TensorKind
from quantdbg.errors import ModelError, QuantDbgWarning
from quantdbg.model import load_model
from quantdbg.model.graph import constant_values, to_graph
from quantdbg.model.load import ModelSource
from quantdbg.model.weights import constant_tensors
from quantdbg.qdq.records import EXTERNAL_CALIBRATOR, QdqRecord, QuantizedModel


def records_from_model(model: ModelSource) -> QuantizedModel:
    """Reads the Q/DQ pairs of a model quantized elsewhere (ModelOpt, ONNX Runtime QDQ format).

    Walks the graph, not the names: every input of a compute node produced by a DequantizeLinear
    becomes a record -- ``QuantizeLinear -> DequantizeLinear -> node`` (weight when the Q reads what
    constants alone compute: an initializer, a Constant node, a Transpose or Cast of one; else
    activation) or ``INT8 initializer -> DequantizeLinear -> node`` (weight, no
    Q). :func:`remove_qdq` then works on these records like on quantdbg's own.

    Args:
        model: The Q/DQ model or its path (never modified).

    Returns:
        The model (nodes named) with one record per (node, dequantized input), calibrator
        ``"external"``.

    Raises:
        ModelError: The model does not load or a DequantizeLinear's scale is not a constant.
    """
    loaded = load_model(model, allow_quantized=True)
    graph = to_graph(loaded)
    computable = constant_tensors(loaded)
    records = []
    for node in graph.nodes:
        if node.op in ("QuantizeLinear", "DequantizeLinear"):
            continue
        for index, tensor in enumerate(node.inputs):
            dq = tensor.inputs[0] if tensor.name and len(tensor.inputs) == 1 else None
            if dq is not None and dq.op == "DequantizeLinear":
                records.append(_external_record(node, index, dq, computable))
    if not records:
        warnings.warn("The model holds no DequantizeLinear feeding a compute node: nothing is "
                      "quantized in Q/DQ form, so there is nothing to analyse or fall back.",
                      QuantDbgWarning, stacklevel=2)
    return QuantizedModel(loaded, tuple(records))


def _external_record(node: gs.Node, index: int, dq: gs.Node, computable: frozenset[str]) -> QdqRecord:
    source = dq.inputs[0]
    producer = source.inputs[0] if len(source.inputs) == 1 else None
    scale = constant_values(dq.inputs[1])
    if scale is None:
        raise ModelError(f"DequantizeLinear {dq.name!r} (feeding node {node.name!r}) has a computed scale; "
                         "only constant scales are supported.")
    zp = constant_values(dq.inputs[2]) if len(dq.inputs) > 2 and dq.inputs[2].name else None
    zp = np.zeros(scale.shape, np.int64) if zp is None else zp
    axis = int(dq.attrs.get("axis", 1)) if scale.size > 1 else None
    if producer is not None and producer.op == "QuantizeLinear":
        fp = producer.inputs[0]
        # Exporters quantize weights wherever they live (tf2onnx: behind a Transpose; FP16 models:
        # behind a Cast), so "weight" means computed from constants alone, not "an initializer".
        kind: TensorKind = TensorKind.WEIGHT if fp.name in computable else TensorKind.ACTIVATION
        quantize_node, tensor = producer.name, fp.name
    else:
        kind, quantize_node, tensor = TensorKind.WEIGHT, None, source.name
    return QdqRecord(node.name, node.op, index, tensor, kind, quantize_node, dq.name,
                     tuple(float(s) for s in np.ravel(scale)), axis, EXTERNAL_CALIBRATOR,
                     tuple(int(z) for z in np.ravel(zp)))

