"""Folding ``1/s`` into the producer of a smoothed activation, where that costs nothing.

A LayerNormalization's gamma/beta, the constant of a Mul/Div, or the columns (and bias) of a
preceding MatMul absorb ``1/s`` -- legal only when every reader of the activation is smoothed
with the same ``s`` (shape readers aside) and the activation is no graph output.
"""
from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from quantdbg.calibration.smoothing.plan import FLOAT, Group
from quantdbg.calibration.smoothing.result import Placement
from quantdbg.model.graph import constant_values
from quantdbg.model.names import UniqueNames

_SHAPE_ONLY_OPS = frozenset({"Shape", "Size"})  # read only the shape, which smoothing keeps


def fold_inverse(group: Group, scale: np.ndarray, outputs: set[str],
          names: UniqueNames) -> tuple[Placement, str] | None:
    """Divides the producer of the group's activation by ``s`` when that is legal.

    Args:
        group: The smoothed nodes and the activation they read.
        scale: The smoothing factors ``s``, one per channel.
        outputs: Names of the graph outputs (their values must not change).
        names: Fresh names for copied constants.

    Returns:
        Where ``1/s`` went and the producer's name, or None when nothing could absorb it.
    """
    tensor = group.tensor
    if tensor.name in outputs or len(tensor.inputs) != 1:
        return None  # a graph output or input must keep its values
    members = {id(n) for n in group.nodes}
    if any(id(c) not in members and c.op not in _SHAPE_ONLY_OPS for c in tensor.outputs):
        return None  # another reader needs the unscaled values
    producer = tensor.inputs[0]
    folders = {"LayerNormalization": _fold_layernorm, "Mul": _fold_scale_constant,
               "Div": _fold_scale_constant, "Add": _fold_bias_matmul, "MatMul": _fold_matmul}
    folder = folders.get(producer.op)
    if folder is None or not folder(producer, tensor, scale, outputs, names):
        return None
    placement: dict[str, Placement] = {"LayerNormalization": "layernorm", "Mul": "scale_constant",
                                       "Div": "scale_constant", "Add": "bias_matmul", "MatMul": "matmul"}
    return placement[producer.op], producer.name


def _fold_layernorm(node: gs.Node, tensor: gs.Tensor, scale: np.ndarray, outputs: set[str],
                    names: UniqueNames) -> bool:
    """``LN(x) * gamma/s + beta/s``: legal when LN normalises the last axis (gamma is [K])."""
    if node.outputs[0] is not tensor:
        return False
    axis = int(node.attrs.get("axis", -1))
    rank = len(node.inputs[0].shape) if node.inputs[0].shape is not None else None
    if not (axis == -1 or (rank is not None and axis == rank - 1)):
        return False
    k = scale.shape[0]
    gamma = constant_values(node.inputs[1])
    beta = constant_values(node.inputs[2]) if len(node.inputs) > 2 and node.inputs[2].name else None
    if gamma is None or gamma.shape != (k,) or gamma.dtype != FLOAT:
        return False
    if len(node.inputs) > 2 and node.inputs[2].name and (beta is None or beta.shape != (k,)):
        return False
    replace_constant(node.inputs[1], gamma / scale, [(node, 1)], names)
    if beta is not None:
        replace_constant(node.inputs[2], beta / scale, [(node, 2)], names)
    return True


def _fold_scale_constant(node: gs.Node, tensor: gs.Tensor, scale: np.ndarray, outputs: set[str],
                         names: UniqueNames) -> bool:
    """``a * (c/s)`` or ``a / (c*s)``: legal when ``c`` is a scalar or a per-last-axis vector."""
    constants = [i for i, t in enumerate(node.inputs) if constant_values(t) is not None]
    if node.op == "Div":
        constants = [i for i in constants if i == 1]
    if len(constants) != 1 or len(node.inputs) != 2:
        return False
    index = constants[0]
    values = constant_values(node.inputs[index])
    assert values is not None
    widened = _per_channel(values, scale.shape[0])
    if widened is None:
        return False
    new = widened / scale if node.op == "Mul" else widened * scale
    shape = (1,) * max(values.ndim - 1, 0) + (scale.shape[0],)
    replace_constant(node.inputs[index], new.reshape(shape).astype(np.float32), [(node, index)], names)
    return True


def _fold_bias_matmul(node: gs.Node, tensor: gs.Tensor, scale: np.ndarray, outputs: set[str],
                      names: UniqueNames) -> bool:
    """``x @ (W/s) + b/s`` for ``Add(MatMul(x, W), b)`` whose MatMul output feeds only the Add."""
    constants = [i for i, t in enumerate(node.inputs) if constant_values(t) is not None]
    if len(constants) != 1 or len(node.inputs) != 2:
        return False
    b_index = constants[0]
    product = node.inputs[1 - b_index]
    matmul = product.inputs[0] if len(product.inputs) == 1 else None
    bias = _per_channel(np.asarray(constant_values(node.inputs[b_index])), scale.shape[0])
    if matmul is None or matmul.op != "MatMul" or bias is None or product.name in outputs \
            or len(product.outputs) != 1 or not _matmul_columns_foldable(matmul, scale.shape[0]):
        return False
    values = constant_values(node.inputs[b_index])
    assert values is not None
    shape = (1,) * max(values.ndim - 1, 0) + (scale.shape[0],)
    replace_constant(node.inputs[b_index], (bias / scale).reshape(shape).astype(np.float32),
                      [(node, b_index)], names)
    _scale_matmul_columns(matmul, scale, names)
    return True


def _fold_matmul(node: gs.Node, tensor: gs.Tensor, scale: np.ndarray, outputs: set[str],
                 names: UniqueNames) -> bool:
    """``x @ (W/s)`` for a MatMul with a 2-D float32 initializer weight."""
    if not _matmul_columns_foldable(node, scale.shape[0]):
        return False
    _scale_matmul_columns(node, scale, names)
    return True


def _matmul_columns_foldable(node: gs.Node, channels: int) -> bool:
    weight = constant_values(node.inputs[1])
    return (constant_values(node.inputs[0]) is None and weight is not None and weight.dtype == FLOAT
            and weight.ndim == 2 and weight.shape[1] == channels)


def _scale_matmul_columns(node: gs.Node, scale: np.ndarray, names: UniqueNames) -> None:
    weight = constant_values(node.inputs[1])
    assert weight is not None
    replace_constant(node.inputs[1], (weight / scale[None, :]).astype(np.float32), [(node, 1)], names)


def _per_channel(values: np.ndarray, channels: int) -> np.ndarray | None:
    """``values`` as a [channels] float32 vector when it broadcasts along the last axis only."""
    if values.dtype != FLOAT:
        return None
    if values.size == 1:
        return np.full(channels, values.reshape(()), np.float32)
    if values.ndim >= 1 and values.shape[-1] == channels and values.size == channels:
        return values.reshape(channels).astype(np.float32)
    return None


def replace_constant(tensor: gs.Tensor, values: np.ndarray, users: list[tuple[gs.Node, int]],
                     names: UniqueNames) -> None:
    """Gives ``users`` the new values: in place when nobody else reads the initializer, else a copy.

    A shared initializer (or a Constant node's output) is left as it is for its other readers.

    Args:
        tensor: The constant the users read.
        values: Their new values (stored as float32).
        users: ``(node, input index)`` pairs that read ``tensor`` and get the new values.
        names: Fresh names for a copy.
    """
    values = np.ascontiguousarray(values, np.float32)
    user_ids = {id(node) for node, _ in users}
    if isinstance(tensor, gs.Constant) and all(id(c) in user_ids for c in tensor.outputs):
        tensor.values = values
        return
    new = gs.Constant(names(f"{tensor.name}/smoothed"), values)
    for node, index in users:
        node.inputs[index] = new
