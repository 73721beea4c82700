"""The mixed-precision model: the fallback nodes lose their Q/DQ pairs and compute in FP16 or FP32."""
from __future__ import annotations

import os
from collections.abc import Iterable

from quantdbg.config import Precision
from quantdbg.fallback.plan import FallbackPlan
from quantdbg.qdq import QuantizedModel, remove_qdq


def mixed_model(qmodel: QuantizedModel, nodes: Iterable[str], precision: Precision) -> QuantizedModel:
    """``qmodel`` with ``nodes`` out of INT8 in ``precision`` (``qmodel`` itself when ``nodes`` is empty).

    Raises:
        ModelError: A node is not quantized in ``qmodel``.
    """
    nodes = tuple(nodes)
    return remove_qdq(qmodel, nodes, precision) if nodes else qmodel


def write_mixed_model(qmodel: QuantizedModel, plan: FallbackPlan | Iterable[str], path: str | os.PathLike,
                      precision: Precision = Precision.FP16) -> QuantizedModel:
    """Writes the mixed-precision model: the plan's nodes lose their Q/DQ pairs.

    Args:
        qmodel: The fully quantized model and its records.
        plan: A plan (its ``nodes``) or node names.
        path: Destination ``.onnx``; its folder must exist.
        precision: FP16 (what TensorRT runs; ONNX Runtime's CPU provider lacks some FP16 kernels)
            or FP32 (for CPU backends).

    Returns:
        The mixed model with its remaining records.

    Raises:
        ModelError: A node is not quantized in ``qmodel``, or the folder does not exist.
    """
    nodes = plan.nodes if isinstance(plan, FallbackPlan) else tuple(plan)
    mixed = remove_qdq(qmodel, nodes, Precision(precision))
    mixed.save(path)
    return mixed


__all__ = ["mixed_model", "write_mixed_model"]
