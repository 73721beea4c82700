"""Static lint of Q/DQ placement for TensorRT: what stops fusion, adds reformats, or fails to build.

TensorRT builds a Q/DQ ONNX model by *fusing* each DequantizeLinear into the layer that consumes it
and each QuantizeLinear into the layer that produces its input. A pair that cannot fuse stays as a
separate scale layer plus format conversions ("reformats"), which is the usual reason an INT8 engine
ends up slower than FP16 (TensorRT issues #993, #3197, #2067). This module finds such placements from
the graph alone -- no TensorRT needed -- the way trt-engine-explorer's engine linters did from a
built engine.

Sources for the rules (each :class:`~quantdbg.diagnostics.lint_rules.Rule` names its own; they live
in :mod:`~quantdbg.diagnostics.lint_rules`, the graph view in :mod:`~quantdbg.diagnostics.qdq_graph`):

* TensorRT Developer Guide, "Explicit Quantization": Q/DQ layer-placement recommendations (quantize
  all inputs of weighted operations; by default do not quantize their outputs; element-wise Add fuses
  into a preceding weighted layer; per-tensor scales for activations and per-channel for weights,
  with the output-channel axis; scales positive; TensorRT does not import QLinear*/*Integer ops) and
  "Q/DQ Limitations" (rewrites that compare scales need equal scales).
* onnx-tensorrt ``docs/operators.md``: per-operator supported types (which ops have INT8 kernels),
  and ``x_zero_point``/``y_zero_point`` must be 0.
* trt-engine-explorer ``trex/lint.py``: unfused Q/DQ layers and channel alignment (16 for INT8).

The lint reads the graph syntactically: it does not simulate TensorRT's Q/DQ propagation through
commuting layers, so a finding is a strong hint, confirmed by building the engine and reading the
engine inspector (:meth:`quantdbg.backends.tensorrt.TrtRunner.layer_precisions`).
"""
from __future__ import annotations

import difflib
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

import onnx

from quantdbg import _display, _json
from quantdbg.diagnostics.findings import (
    NO_EVIDENCE,
    Finding,
    Severity,
    reaches,
    severity_counts,
)
from quantdbg.diagnostics.lint_rules import RULES
from quantdbg.diagnostics.qdq_graph import QdqGraph
from quantdbg.errors import ConfigError
from quantdbg.model import load_model
from quantdbg.model.load import ModelSource

LINT_SEVERITIES: tuple[Severity, ...] = tuple(
    s for s in Severity if any(r.severity is s for r in RULES.values()))
"""The severities lint rules give (a lint report counts these)."""


def _sort_key(finding: Finding) -> tuple[int, int, str]:
    order = list(RULES).index(finding.check) if finding.check in RULES else len(RULES)
    return (-finding.severity.rank, order, finding.subjects[0])


@dataclass(frozen=True)
class _LintEntry:
    """A lint finding as lint reports have always written it."""

    rule: str
    severity: Severity
    node: str
    message: str
    fix: str


@dataclass(frozen=True)
class _LintForm:
    findings: tuple[_LintEntry, ...]
    model: str = ""


def _untagged(data: dict[str, Any]) -> dict[str, Any] | None:
    """A lint report written before reports had a tag: recognised by its keys."""
    findings = data.get("findings")
    if isinstance(findings, list) and "counts" in data and all(isinstance(f, dict) and "rule" in f
                                                               for f in findings):
        return data
    return None


@_json.document("quantdbg.lint", 1, untagged=_untagged)
@dataclass(frozen=True, repr=False)
class LintReport(_display.Displayable, _json.Serializable):
    """The findings of :func:`lint`, most severe first.

    Each finding's ``check`` is its rule id, its only subject the node, its ``title`` the full
    message. The JSON form keeps lint's own keys (``rule``, ``severity``, ``node``, ``message``,
    ``fix`` per finding, and ``counts``).

    Attributes:
        findings: Sorted by severity, then rule, then node name.
        model: What was linted (a path or the graph name), for rendering.
    """

    findings: tuple[Finding, ...]
    model: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "findings", tuple(sorted(self.findings, key=_sort_key)))

    def counts(self) -> dict[str, int]:
        """Number of findings per severity lint rules give (each present, possibly 0)."""
        return severity_counts(self.findings, LINT_SEVERITIES)

    def at_or_above(self, severity: Severity | str) -> tuple[Finding, ...]:
        """The findings of ``severity`` or worse (a severity or a word :meth:`Severity.parse` reads)."""
        threshold = Severity.parse(severity)
        return tuple(f for f in self.findings if f.severity.rank >= threshold.rank)

    def fails(self, fail_on: str | Severity) -> bool:
        """Whether a finding reaches the ``--fail-on`` threshold (never for ``"never"``)."""
        return reaches(self.findings, fail_on)

    def __json_encode__(self) -> dict[str, Any]:
        entries = tuple(_LintEntry(f.check, f.severity, f.subjects[0], f.title, f.fix) for f in self.findings)
        return {"model": self.model, "counts": self.counts(), "findings": _json.encode(entries)}

    @classmethod
    def __json_decode__(cls, data: Any, where: str) -> LintReport:
        form = _json.decode(_LintForm, data, where)  # "counts" is derived: recomputed, not read
        return cls(tuple(Finding(e.rule, e.severity, 0.0, e.message, (e.node,), NO_EVIDENCE, e.fix)
                         for e in form.findings), form.model)


def lint(model: ModelSource, *, skip: Collection[str] = ()) -> LintReport:
    """Checks a Q/DQ model's quantization placement against TensorRT's fusion rules.

    Args:
        model: The Q/DQ ONNX model (path or ModelProto; never modified). Models quantized by ONNX
            Runtime or ModelOpt are accepted. Unnamed nodes are reported as ``<op_type>_<index>``.
        skip: Rule ids to leave out (see :data:`~quantdbg.diagnostics.lint_rules.RULES`).

    Returns:
        The findings, most severe first.

    Raises:
        ModelError: The model does not load or validate.
        ConfigError: ``skip`` names an unknown rule.
    """
    for rule in skip:
        if rule not in RULES:
            near = difflib.get_close_matches(rule, list(RULES), n=3)
            hint = (f" Did you mean {', '.join(map(repr, near))}?" if near
                    else f" Known rules: {', '.join(RULES)}.")
            raise ConfigError(f"No lint rule named {rule!r}.{hint}")
    proto = load_model(model, allow_quantized=True)
    graph = QdqGraph(proto)
    findings = [finding for rule in RULES.values() if rule.id not in skip for finding in rule.find(graph)]
    label = str(model) if not isinstance(model, onnx.ModelProto) else (proto.graph.name or "")
    return LintReport(tuple(findings), label)
