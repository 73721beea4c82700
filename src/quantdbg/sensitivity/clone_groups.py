"""The local graph's clones split across sessions, so no session holds every fake-quantized weight.

A local graph holds the FP32 model's weights and, per cloned layer, the layer's fake-quantized
weights, both as constants ONNX Runtime prepacks for its GEMM kernels: twice the weights in one
session. The clones are therefore grouped, in the order given, into runs whose weights stay under
a share of the model's; each group is one session of the FP32 model plus its clones, over the
same batches. A clone is the same nodes reading the same constants in any group, so its error is
too; only the FP32 model runs once per group. A small model is one group: one session, as before.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence

import onnx

from quantdbg.config import TensorKind
from quantdbg.model.external import tensor_nbytes, weight_bytes
from quantdbg.model.graph import nodes_by_name
from quantdbg.qdq import QuantizedModel
from quantdbg.sensitivity.graphs import LocalVariant

GROUP_SHARE = 4
"""A group's weights are at most 1/GROUP_SHARE of the model's (so a session holds ~1.25x them)."""
GROUP_FLOOR = 128 * 2**20
"""...and never need be under this many bytes: a model below GROUP_SHARE times it is one group."""


def layer_weight_bytes(fp_model: onnx.ModelProto, qmodel: QuantizedModel,
                       layers: Iterable[str]) -> dict[str, int]:
    """Layer -> bytes of the FP32 weights its clone fake-quantizes (no data file is read)."""
    sizes = {init.name: tensor_nbytes(init) for init in fp_model.graph.initializer}
    nodes = nodes_by_name(fp_model)
    found = {}
    for layer in layers:
        inputs = nodes[layer].input if layer in nodes else ()
        found[layer] = sum(sizes.get(inputs[r.input_index], 0) for r in qmodel.records_of(layer)
                           if r.kind is TensorKind.WEIGHT and r.input_index < len(inputs))
    return found


def clone_groups(fp_model: onnx.ModelProto, qmodel: QuantizedModel, variants: Sequence[LocalVariant],
                 budget: int | None = None) -> list[list[int]]:
    """Splits ``variants`` into runs of consecutive indices whose layers' weights fit ``budget``.

    A layer's variants share its fake-quantized weights, so they stay in one group; a layer over
    the budget is a group of its own.

    Args:
        fp_model: The FP32 model (weight sizes only; no weight is read).
        qmodel: The Q/DQ model's records.
        variants: The clones, in graph order.
        budget: Bytes per group (default: the model's weights / :data:`GROUP_SHARE`, at least
            :data:`GROUP_FLOOR`).

    Returns:
        The groups (variant indices, in order); one group when everything fits.
    """
    if budget is None:
        budget = max(weight_bytes(fp_model) // GROUP_SHARE, GROUP_FLOOR)
    sizes = layer_weight_bytes(fp_model, qmodel, (v.layer for v in variants))
    groups: list[list[int]] = []
    held, layers = 0, set()
    for index, variant in enumerate(variants):
        grows = variant.layer not in layers
        if not groups or grows and layers and held + sizes[variant.layer] > budget:
            groups.append([])
            held, layers = 0, set()
        if grows:
            held += sizes[variant.layer]
            layers.add(variant.layer)
        groups[-1].append(index)
    return groups


__all__ = ["GROUP_FLOOR", "GROUP_SHARE", "clone_groups", "layer_weight_bytes"]
