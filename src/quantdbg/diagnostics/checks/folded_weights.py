"""Weights the model held outside plain initializers (Constant nodes, Transpose/Cast/... of
initializers, initializers listed as graph inputs), and what loading did with them."""
from __future__ import annotations

from collections.abc import Sequence

from quantdbg.diagnostics.checks.base import Check, CheckContext, CheckOutcome
from quantdbg.diagnostics.findings import Evidence, Finding, Severity
from quantdbg.model.weights import FoldedWeight, summarize_folded


def folded_evidence(items: Sequence[FoldedWeight]) -> Evidence:
    """The weights as a table: one row per (node, input), how it was held and what was done."""
    return Evidence(("node", "input", "tensor", "held as", "done"),
                    tuple((w.node, w.input_index, w.tensor, w.held, w.action) for w in items))


def check_folded_weights(items: Sequence[FoldedWeight]) -> CheckOutcome:
    """Says which weights loading found outside plain initializers and how it handled them.

    Args:
        items: The weights (:attr:`quantdbg.model.LoadedModel.folded`).

    Returns:
        An ``info`` finding listing them (none for a clean export); the data holds them.
    """
    if not items:
        return CheckOutcome()
    finding = Finding(
        "folded_weights", Severity.INFO, float(len(items)),
        f"{summarize_folded(items)}; each is quantized as a weight, per output channel with its own "
        "max|w|", tuple(dict.fromkeys(w.node for w in items)), folded_evidence(items),
        "Nothing to do for quantdbg. Other quantizers may take such weights for activations and clip "
        "them with one calibrated scale: re-export the model with its weights as initializers before "
        "using them, and check their Q/DQ models with `quantdbg lint`.")
    return CheckOutcome((finding,), tuple(items))


def run(ctx: CheckContext) -> CheckOutcome:
    """The doctor's run: the weights loading folded."""
    return check_folded_weights(ctx.folded_weights)


CHECK = Check("folded_weights", run)
