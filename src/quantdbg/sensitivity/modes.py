"""The mode registry: each sensitivity mode's name -> the function that measures it.

A mode function takes the evaluator, the analysis settings and the journal, and returns a
:class:`~quantdbg.sensitivity.measurement.Measurement` that
:func:`~quantdbg.sensitivity.analyze.analyze_sensitivity` ranks into the report.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType

from quantdbg._journal import Journal
from quantdbg.sensitivity.config import Mode, SensitivityConfig
from quantdbg.sensitivity.cumulative import measure_cumulative
from quantdbg.sensitivity.local import measure_local
from quantdbg.sensitivity.measurement import Measurement
from quantdbg.sensitivity.sweep import measure_sweep
from quantdbg.variants.evaluator import VariantEvaluator

ModeFunction = Callable[[VariantEvaluator, SensitivityConfig, Journal], Measurement]
"""``measure(evaluator, config, journal) -> Measurement``."""

MODE_FUNCTIONS: Mapping[Mode, ModeFunction] = MappingProxyType({
    "local": measure_local,
    "cumulative": measure_cumulative,
    "isolated": measure_sweep,
    "leave-one-out": measure_sweep,
})
"""Every mode of :data:`~quantdbg.sensitivity.config.MODES` and its implementation."""


def measure(evaluator: VariantEvaluator, config: SensitivityConfig, journal: Journal) -> Measurement:
    """Runs ``config.mode`` on ``evaluator``."""
    return MODE_FUNCTIONS[config.mode](evaluator, config, journal)


__all__ = ["MODE_FUNCTIONS", "ModeFunction", "measure"]
