"""Variants of a Q/DQ model -- any subset of its layers quantized -- run over the data and scored.

``switch`` (the Q/DQ model with every recorded pair behind a per-layer switch; ``bias_switch`` and
``lazy_pairs`` are its parts) -> ``evaluator`` (:class:`VariantEvaluator`: every variant is a feed
to one session of that graph, scored against FP32). Sensitivity, the fallback search, the doctor and
the automatic flow all run their variants through it.
"""
from quantdbg.variants.evaluator import VariantEvaluator, VariantResult
from quantdbg.variants.switch import SwitchGraph, switch_graph

__all__ = ["SwitchGraph", "VariantEvaluator", "VariantResult", "switch_graph"]
