"""Every doctor check by name, in the order the doctor runs them."""
from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from quantdbg.diagnostics.checks import (
    calibration_size,
    calibrator_disagreement,
    folded_weights,
    mixed_ranges,
    qdq_fusion,
    sensitive_layers,
    weight_zeroing,
)
from quantdbg.diagnostics.checks.base import Check
from quantdbg.diagnostics.doctor_config import CHECKS, CheckName

_MODULES = (sensitive_layers, weight_zeroing, calibrator_disagreement, calibration_size, mixed_ranges,
            qdq_fusion, folded_weights)

CHECK_REGISTRY: Mapping[CheckName, Check] = MappingProxyType(
    {check.name: check for check in sorted((m.CHECK for m in _MODULES), key=lambda c: CHECKS.index(c.name))})
"""Check name -> its :class:`~quantdbg.diagnostics.checks.base.Check`, in :data:`CHECKS` order
(the sensitivity check runs first: the calibrator check reads its evidence)."""
