"""What every doctor check shares: the context it reads, the outcome it returns, its registry entry.

A check's ``run(context)`` measures (the measurements are frozen dataclasses, also what the report
plots) and judges: it returns a :class:`CheckOutcome` holding the measurements and the findings
they justify, each with its evidence and a fix. A check that finds nothing returns no finding;
the thresholds live in :class:`~quantdbg.diagnostics.doctor_config.DoctorConfig`.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import onnx

from quantdbg.calibration import CalibrationResult
from quantdbg.data import CalibrationData
from quantdbg.diagnostics.doctor_config import CheckName, DoctorConfig
from quantdbg.diagnostics.findings import Finding
from quantdbg.evaluation import TaskMetric
from quantdbg.model.weights import FoldedWeight
from quantdbg.qdq import QuantizedModel
from quantdbg.sensitivity import SensitivityReport


@dataclass(frozen=True)
class CheckOutcome:
    """What one check measured and concluded.

    Attributes:
        findings: Findings (empty when the check found nothing wrong).
        data: The measurements, one dataclass per node/tensor (check-specific types).
    """

    findings: tuple[Finding, ...] = ()
    data: tuple[Any, ...] = ()


@dataclass
class CheckContext:
    """What the checks of one diagnosis share: the models, the data and the results so far.

    Attributes:
        fp_model: The FP32 model.
        calib: Calibration data.
        evals: Data for the sensitivity checks.
        qmodel: The Q/DQ model (its calibration attached).
        config: What runs and the thresholds.
        metric: Task metric scored besides output SQNR.
        progress: Show progress bars.
        sensitivity: The local ranking, once ``sensitive_layers`` has run (later checks use its
            evidence).
        folded_weights: Weights loading found outside plain initializers and folded
            (:attr:`quantdbg.model.LoadedModel.folded`).
    """

    fp_model: onnx.ModelProto
    calib: CalibrationData
    evals: CalibrationData
    qmodel: QuantizedModel
    config: DoctorConfig
    metric: TaskMetric | str
    progress: bool = False
    sensitivity: SensitivityReport | None = field(default=None)
    folded_weights: tuple[FoldedWeight, ...] = ()

    @property
    def calibration(self) -> CalibrationResult:
        """The ranges and statistics the Q/DQ model was built from."""
        assert self.qmodel.calibration is not None  # quantize() attaches it
        return self.qmodel.calibration


@dataclass(frozen=True)
class Check:
    """One registered check.

    Attributes:
        name: Its name (see :data:`~quantdbg.diagnostics.doctor_config.CHECKS`).
        run: Measures and judges on a context.
    """

    name: CheckName
    run: Callable[[CheckContext], CheckOutcome]
