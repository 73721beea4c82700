"""Placement: which (node, input) pairs of the FP32 model get Q/DQ, decided before calibration."""
from quantdbg.placement.plan import QdqPlan, QuantTarget, plan_qdq

__all__ = ["QdqPlan", "QuantTarget", "plan_qdq"]
