"""Placement: which (node, input) pairs of the FP32 model get Q/DQ, decided before calibration."""
from quantdbg._exports import public_names as _public_names
from quantdbg.placement.plan import DEFAULT_QUANT as DEFAULT_QUANT
from quantdbg.placement.plan import QdqPlan as QdqPlan
from quantdbg.placement.plan import QuantTarget as QuantTarget
from quantdbg.placement.plan import plan_qdq as plan_qdq

__all__ = _public_names(globals())
