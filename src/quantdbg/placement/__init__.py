"""Placement: which (node, input) pairs of the FP32 model get Q/DQ, decided before calibration."""
from quantdbg.placement.plan import DEFAULT_QUANT, QdqPlan, QuantTarget, is_float, plan_qdq

__all__ = ["DEFAULT_QUANT", "QdqPlan", "QuantTarget", "is_float", "plan_qdq"]
