"""Q/DQ placements TensorRT cannot fuse: the static lint, one finding per rule that fired."""
from __future__ import annotations

import onnx

from quantdbg.diagnostics.checks.base import Check, CheckContext, CheckOutcome
from quantdbg.diagnostics.findings import Evidence, Finding
from quantdbg.diagnostics.lint_rules import RULES
from quantdbg.diagnostics.linter import lint


def check_qdq_fusion(model: onnx.ModelProto) -> CheckOutcome:
    """Runs the TensorRT Q/DQ lint (:func:`~quantdbg.diagnostics.linter.lint`) and groups its
    findings by rule.

    Args:
        model: The Q/DQ model.

    Returns:
        One finding per lint rule that fired, with that rule's severity; the data holds the
        :class:`~quantdbg.diagnostics.linter.LintReport`.
    """
    report = lint(model)
    by_rule: dict[str, list[Finding]] = {}
    for item in report.findings:
        by_rule.setdefault(item.check, []).append(item)
    findings = []
    for rule, items in by_rule.items():
        title = RULES[rule].title if rule in RULES else rule
        findings.append(Finding(
            "qdq_fusion", items[0].severity, float(len(items)),
            f"TensorRT lint `{rule}`: {title} ({len(items)} node(s))", tuple(i.subjects[0] for i in items),
            Evidence(("node", "finding"), tuple((i.subjects[0], i.title) for i in items)), items[0].fix))
    return CheckOutcome(tuple(findings), (report,))


def run(ctx: CheckContext) -> CheckOutcome:
    """The doctor's run: the lint of the Q/DQ model."""
    return check_qdq_fusion(ctx.qmodel.model)


CHECK = Check("qdq_fusion", run)
