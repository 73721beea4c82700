"""The migration itself: the factors ``s``, ``1/s`` folded upstream or inserted as a Mul, and the
weight rows multiplied by ``s``."""
from __future__ import annotations

import logging
from collections.abc import Mapping

import numpy as np
import onnx_graphsurgeon as gs

from quantdbg.calibration.smoothing.config import SmoothingConfig
from quantdbg.calibration.smoothing.fold import fold_inverse, replace_constant
from quantdbg.calibration.smoothing.plan import Group, row_axis
from quantdbg.calibration.smoothing.result import Migration, Placement
from quantdbg.errors import DataError, ModelError
from quantdbg.model.graph import constant_values
from quantdbg.model.names import UniqueNames
from quantdbg.quant_math import channel_amax

logger = logging.getLogger(__name__)


def smoothing_scales(act_absmax: np.ndarray, weight_absmax: np.ndarray, alpha: float,
                     max_scale: float = 1e4) -> np.ndarray:
    """``s_j = max|X_j|^alpha / max|W_j|^(1-alpha)``, clipped to ``[1/max_scale, max_scale]``.

    A channel whose activation or weight range is zero keeps ``s_j = 1`` (there is nothing to
    balance, and a zero would divide).

    Args:
        act_absmax: Per-channel max |x| of the activation.
        weight_absmax: Per-input-channel (row) max |w| over every weight reading it.
        alpha: Migration strength in [0, 1].
        max_scale: Clip bound (>= 1).

    Returns:
        float32 vector ``s``.

    Raises:
        ModelError: The two vectors differ in length.
    """
    act = np.asarray(act_absmax, np.float64)
    weight = np.asarray(weight_absmax, np.float64)
    if act.shape != weight.shape:
        raise ModelError(f"Activation ranges cover {act.shape} channels but the weights have {weight.shape} "
                         "input channels; they must match.")
    valid = (act > 0) & (weight > 0) & np.isfinite(act) & np.isfinite(weight)
    scale = np.ones_like(act)
    scale[valid] = act[valid] ** alpha / weight[valid] ** (1.0 - alpha)
    return np.clip(scale, 1.0 / max_scale, max_scale).astype(np.float32)


def absmax_for(group: Group, act_absmax: Mapping[str, np.ndarray]) -> np.ndarray:
    """The measured per-channel max |x| of the group's activation, checked against its weights.

    Raises:
        DataError: The activation was not measured.
        ModelError: The vector's length differs from the weights' input channels.
    """
    name = group.tensor.name
    if name not in act_absmax:
        raise DataError(f"No per-channel range for activation {name!r} (read by {group.nodes[0].name!r}); "
                        "measure it with collect_channel_absmax() or call smooth().")
    absmax = np.asarray(act_absmax[name], np.float64)
    if absmax.shape != (group.channels,):
        raise ModelError(f"The range of activation {name!r} has shape {absmax.shape}, but node "
                         f"{group.nodes[0].name!r} has {group.channels} input channels.")
    return absmax


def migrate(graph: gs.Graph, group: Group, absmax: np.ndarray, config: SmoothingConfig,
             outputs: set[str], names: UniqueNames) -> Migration:
    """Computes ``s`` for one group, moves ``1/s`` upstream and scales the weight rows.

    Args:
        graph: The graph being rewritten (edited in place).
        group: The nodes sharing one ``s`` and the activation they read.
        absmax: The activation's per-channel max |x| (from :func:`absmax_for`).
        config: Strength, clipping and whether to fold.
        outputs: Names of the graph outputs (never rescaled).
        names: Fresh names for inserted nodes and copied constants.

    Returns:
        The record of the migration.
    """
    weights = _unique_weights(group)
    w_rows = np.max([_row_absmax(values, axis) for _, values, axis in weights], axis=0)
    scale = smoothing_scales(absmax, w_rows, config.alpha, config.max_scale)
    tensor = group.tensor  # read before the rewrite rewires the nodes
    folded = fold_inverse(group, scale, outputs, names) if config.fold else None
    placement, where = folded if folded is not None else _insert_mul(graph, group, scale, names)
    smoothed_tensor = group.nodes[0].inputs[0].name
    for weight, values, axis in weights:
        shape = [1, 1]
        shape[axis] = -1
        users = [(n, 1) for n in group.nodes if n.inputs[1] is weight]
        replace_constant(weight, values * scale.reshape(shape), users, names)
    after = absmax / scale
    logger.debug("smoothed %s (%s into %s)", tensor.name, placement, where)
    return Migration(
        nodes=tuple(n.name for n in group.nodes), tensor=tensor.name, smoothed_tensor=smoothed_tensor,
        weights=tuple(w.name for w, _, _ in weights), placement=placement, folded_into=where,
        channels=group.channels, alpha=config.alpha, scale_min=float(scale.min()),
        scale_max=float(scale.max()), scale_geomean=float(np.exp(np.log(scale.astype(np.float64)).mean())),
        act_absmax_before=float(absmax.max()), act_absmax_after=float(after.max()),
        act_outlier_before=_outlier_ratio(absmax), act_outlier_after=_outlier_ratio(after),
        weight_absmax_before=float(w_rows.max()), weight_absmax_after=float((w_rows * scale).max()),
        weight_outlier_before=_outlier_ratio(w_rows), weight_outlier_after=_outlier_ratio(w_rows * scale))


def _unique_weights(group: Group) -> list[tuple[gs.Tensor, np.ndarray, int]]:
    seen: dict[int, tuple[gs.Tensor, np.ndarray, int]] = {}
    for node in group.nodes:
        weight = node.inputs[1]
        if id(weight) not in seen:
            seen[id(weight)] = (weight, np.asarray(constant_values(weight), np.float32), row_axis(node))
    return list(seen.values())


def _row_absmax(values: np.ndarray, axis: int) -> np.ndarray:
    return channel_amax(values, axis).reshape(-1).astype(np.float64)


def _outlier_ratio(absmax: np.ndarray) -> float:
    """Largest channel range over the median one (channels that never moved left out)."""
    live = absmax[absmax > 0]
    return float(live.max() / np.median(live)) if live.size else 1.0


def _insert_mul(graph: gs.Graph, group: Group, scale: np.ndarray,
                names: UniqueNames) -> tuple[Placement, str]:
    """Inserts ``x * (1/s)`` feeding only the group's nodes; returns the placement and Mul name."""
    tensor = group.tensor
    base = f"{tensor.name}/smooth"
    inverse = gs.Constant(names(f"{base}/inv_scale"), (np.float32(1.0) / scale).astype(np.float32))
    out = gs.Variable(names(f"{base}/output"), np.float32, tensor.shape)
    mul = gs.Node("Mul", names(f"{base}/Mul"), inputs=[tensor, inverse], outputs=[out])
    for node in group.nodes:
        node.inputs[0] = out
    graph.nodes.append(mul)  # to_model() toposorts
    return "explicit_mul", mul.name
