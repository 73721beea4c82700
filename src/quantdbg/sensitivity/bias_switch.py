"""The bias switches of the switchable graph: a bias corrected for INT8 weights is on only with them."""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from quantdbg.model.names import UniqueNames
from quantdbg.qdq import QuantizedModel


def switch_biases(qmodel: QuantizedModel, nodes: Mapping[str, onnx.NodeProto], switches: Mapping[str, str],
                  names: UniqueNames, added: list[onnx.TensorProto],
                  ifs: dict[str, list[onnx.NodeProto]]) -> None:
    """Puts each bias corrected for a layer's INT8 weights behind the layer's switch (in place).

    Off, the layer computes with its FP32 bias (zeros where it had none), so all switches off is
    the FP32 model again.

    Args:
        qmodel: The Q/DQ model; its calibration holds the corrections.
        nodes: Node name -> node of the switchable model being built.
        switches: Layer -> its switch input.
        names: Fresh names.
        added: Initializers to add (the FP32 biases are appended).
        ifs: Consumer node -> the If nodes to place just before it (the bias Ifs are appended).
    """
    corrections = qmodel.calibration.bias_correction if qmodel.calibration is not None else None
    for c in corrections.corrections if corrections is not None else ():
        if c.node not in switches:
            continue
        owner = nodes[c.owner]
        base = f"{c.node}/bias/switch"
        fp32 = numpy_helper.from_array(c.original if c.original is not None else np.zeros_like(c.corrected),
                                       names(f"{c.node}/bias_fp32"))
        added.append(fp32)
        on, off, out = names(f"{base}/on"), names(f"{base}/off"), names(f"{base}/output")
        corrected = owner.input[c.input_index]
        then = [helper.make_node("Identity", [corrected], [on], name=names(f"{base}/OnIdentity"))]
        other = [helper.make_node("Identity", [fp32.name], [off], name=names(f"{base}/OffIdentity"))]
        ifs.setdefault(c.owner, []).append(helper.make_node(
            "If", [switches[c.node]], [out], name=names(f"{c.node}/bias/switch"),
            then_branch=_branch(f"{base}/then", then, on), else_branch=_branch(f"{base}/else", other, off)))
        owner.input[c.input_index] = out


def _branch(name: str, nodes: list[onnx.NodeProto], output: str) -> onnx.GraphProto:
    info = helper.make_tensor_value_info(output, TensorProto.FLOAT, None)
    return helper.make_graph(nodes, name, [], [info])


__all__ = ["switch_biases"]
