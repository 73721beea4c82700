"""Which nodes smoothing rewrites: the selected MatMul/Gemm nodes, grouped by the activation they read."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_graphsurgeon as gs

from quantdbg.calibration.smoothing.config import SmoothingConfig
from quantdbg.calibration.smoothing.result import SkippedNode
from quantdbg.model.graph import constant_values, is_float, trans_b
from quantdbg.model.names import check_node_globs

FLOAT = np.dtype(np.float32)


@dataclass
class Group:
    """The selected nodes reading one activation tensor; they share one ``s``.

    Attributes:
        tensor: The activation they read (input 0).
        nodes: The nodes, in graph order.
        channels: Input channels of their weights (the activation's last axis).
    """

    tensor: gs.Tensor
    nodes: list[gs.Node]
    channels: int


def plan_groups(graph: gs.Graph, config: SmoothingConfig) -> tuple[list[Group], list[SkippedNode]]:
    """Groups the selected nodes by the activation they read, in graph order.

    Args:
        graph: The model's graph (not modified).
        config: Op types and node selection.

    Returns:
        The groups, and the selected nodes that cannot be smoothed, with the reason.

    Raises:
        ModelError: A ``nodes``/``exclude`` glob matches no node.
    """
    names = [node.name for node in graph.nodes]
    check_node_globs("SmoothingConfig.nodes", config.nodes, names)
    check_node_globs("SmoothingConfig.exclude", config.exclude, names)
    groups: dict[str, Group] = {}
    skipped: list[SkippedNode] = []
    for node in graph.nodes:
        if node.op not in config.op_types or not config.selects(node.name):
            continue
        channels, reason = _weight_channels(node)
        if reason is None:
            group = groups.setdefault(node.inputs[0].name, Group(node.inputs[0], [], channels))
            if group.channels != channels:
                reason = (f"its weight has {channels} input channels but other nodes reading "
                          f"{node.inputs[0].name!r} have {group.channels}")
            else:
                group.nodes.append(node)
        if reason is not None:
            skipped.append(SkippedNode(node.name, reason))
    return list(groups.values()), skipped


def _weight_channels(node: gs.Node) -> tuple[int, str | None]:
    """(input channels K, None) for a smoothable node, else (0, why not)."""
    if len(node.inputs) < 2:
        return 0, "it has fewer than two inputs"
    act, weight = node.inputs[0], node.inputs[1]
    if constant_values(act) is not None:
        return 0, "input 0 is a constant, not an activation"
    values = constant_values(weight)
    if values is None:
        return 0, f"input 1 ({weight.name!r}) is not an initializer (an activation-by-activation product)"
    if values.dtype != FLOAT or values.ndim != 2:
        return 0, (f"weight {weight.name!r} is {values.dtype} of rank {values.ndim}; "
                   "only 2-D float32 weights are smoothed")
    if not is_float(act):
        return 0, f"activation {act.name!r} is not float32"
    if node.op == "Gemm" and node.attrs.get("transA", 0):
        return 0, "Gemm with transA=1 (its channels are not on the last axis)"
    k = values.shape[row_axis(node)]
    last = act.shape[-1] if act.shape else None
    if isinstance(last, int) and last != k:
        return 0, f"activation {act.name!r} has {last} channels but weight {weight.name!r} expects {k}"
    return int(k), None


def row_axis(node: gs.Node) -> int:
    """Axis of a smoothed node's weight that indexes its input channels (1 for Gemm with transB)."""
    return 1 if trans_b(node) else 0
