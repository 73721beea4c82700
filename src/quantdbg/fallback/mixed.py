"""The mixed-precision model: the excluded nodes lose their Q/DQ pairs and compute in FP16 or FP32."""
from __future__ import annotations

import os
from collections.abc import Iterable

from quantdbg.config import Precision
from quantdbg.fallback.plan import FallbackPlan
from quantdbg.qdq import QuantizedModel, remove_qdq


def mixed_model(qmodel: QuantizedModel, exclude: Iterable[str], precision: Precision) -> QuantizedModel:
    """``qmodel`` with ``exclude`` out of INT8 in ``precision`` (``qmodel`` itself when ``exclude`` is empty).

    Raises:
        ModelError: A node is not quantized in ``qmodel``.
    """
    exclude = tuple(exclude)
    return remove_qdq(qmodel, exclude, precision) if exclude else qmodel


def write_mixed_model(qmodel: QuantizedModel, plan: FallbackPlan | Iterable[str], path: str | os.PathLike,
                      precision: Precision = Precision.FP16) -> QuantizedModel:
    """Writes the mixed-precision model: the plan's excluded nodes lose their Q/DQ pairs.

    Args:
        qmodel: The fully quantized model and its records.
        plan: A plan (its ``exclude``) or the node names to keep out of INT8.
        path: Destination ``.onnx``; its folder must exist.
        precision: FP16 (what TensorRT runs; ONNX Runtime's CPU provider lacks some FP16 kernels)
            or FP32 (for CPU backends).

    Returns:
        The mixed model with its remaining records.

    Raises:
        ModelError: A node is not quantized in ``qmodel``, or the folder does not exist.
    """
    exclude = plan.exclude if isinstance(plan, FallbackPlan) else tuple(plan)
    mixed = remove_qdq(qmodel, exclude, Precision(precision))
    mixed.save(path)
    return mixed


__all__ = ["mixed_model", "write_mixed_model"]
