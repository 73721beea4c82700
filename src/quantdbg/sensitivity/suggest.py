"""Per-tensor calibrator choice from the evidence of a sensitivity report."""
from __future__ import annotations

from quantdbg.config import TensorKind
from quantdbg.quant_math import nsr
from quantdbg.sensitivity.report import EvidenceReport, SensitivityReport


def suggest_calibrators(report: SensitivityReport | EvidenceReport,
                        only_changes: bool = True) -> dict[str, str]:
    """Per-tensor calibrator choice from a report's evidence (for ``CalibConfig.per_tensor``).

    For every activation tensor, the calibrator that minimises the summed local noise power
    (``10^(-SQNR/10)``) of the layers reading it -- several layers can read one tensor (e.g. the
    query, key and value projections), and one range serves them all.

    Args:
        report: A report computed with ``evidence=True``, or the evidence alone
            (:func:`~quantdbg.sensitivity.analyze_evidence`).
        only_changes: Leave out tensors whose best calibrator is the one already used.

    Returns:
        Exact-match glob (special characters escaped) -> calibrator name, in graph order.
    """
    noise: dict[str, dict[str, float]] = {}
    used: dict[str, str] = {}
    for layer in report.layers:
        candidates = layer.evidence.calibrator_sqnr if layer.evidence is not None else None
        for inp in layer.inputs:
            if inp.kind is not TensorKind.ACTIVATION or not candidates:
                continue
            used[inp.tensor] = inp.calibrator
            totals = noise.setdefault(inp.tensor, {})
            for name, sqnr in candidates.items():
                totals[name] = totals.get(name, 0.0) + nsr(sqnr)
    chosen = {t: min(sorted(c), key=c.__getitem__) for t, c in noise.items() if c}
    return {_glob_escape(t): m for t, m in chosen.items() if not only_changes or m != used.get(t)}


def _glob_escape(name: str) -> str:
    return "".join(f"[{c}]" if c in "*?[" else c for c in name)


__all__ = ["suggest_calibrators"]
