"""The planted detector (tests/models_detector.py): the culprits the local ranking puts last are found by
the ``auto`` search within its stated budget, and the output-space ranking puts them first."""
from __future__ import annotations

import models_detector as md
import numpy as np
import pytest

from quantdbg.backends import OnnxrtRunnerFactory, OrtConfig
from quantdbg.config import Precision
from quantdbg.fallback import FallbackConfig, FallbackTarget, auto_fallback
from quantdbg.fallback.budget import search_bound
from quantdbg.sensitivity import SensitivityConfig, VariantEvaluator

ONE_THREAD = OnnxrtRunnerFactory(OrtConfig(intra_op_num_threads=1))
TARGET = FallbackTarget.max_relative_loss(1.0)  # decisions agree with FP32's on >= 99 %


@pytest.fixture(scope="module")
def detector():
    model = md.detector()
    data = md.feeds(np.random.default_rng(0))
    return model, data, md.quantized(model, data)


def _fallback(detector, strategy: str = "auto", output_samples: int = 0):
    model, data, qmodel = detector
    config = FallbackConfig(SensitivityConfig(evidence=False, output_samples=output_samples), strategy,
                            Precision.FP32)
    with VariantEvaluator(model, qmodel, data, md.DECISIONS, ONE_THREAD) as evaluator:
        int8 = evaluator.run(evaluator.layers).value
        alone = {c: evaluator.run([n for n in evaluator.layers if n != c]).value for c in md.CULPRITS}
        return auto_fallback(evaluator, TARGET, config), int8, alone


def test_the_planted_head_is_what_breaks_the_decisions_and_local_mode_ranks_it_last(detector):
    result, int8, alone = _fallback(detector)
    assert int8 < 0.99 and all(value < 0.99 for value in alone.values())  # either culprit alone flips
    assert set(result.report.ranking[-2:]) == set(md.CULPRITS)


def test_auto_search_finds_the_planted_head_within_its_budget(detector):
    result, _, _ = _fallback(detector)
    plan = result.plan
    n_layers = len(plan.ranking)
    assert plan.status == "met" and plan.value == 1.0
    assert set(md.CULPRITS) <= set(plan.exclude) and len(plan.exclude) <= len(md.CULPRITS) + 2
    assert plan.n_evaluations <= search_bound(n_layers, len(md.CULPRITS)) <= plan.budget
    assert plan.phases["group"] > 0
    assert result.mixed is not None and set(result.mixed.excluded) == set(plan.exclude)


def test_bisect_trusts_the_local_ranking_and_keeps_most_layers_out(detector):
    plan = _fallback(detector, "bisect")[0].plan
    assert plan.status == "met" and len(plan.exclude) >= len(plan.ranking) - 2


def test_the_output_space_ranking_puts_the_head_first_and_the_report_says_so(detector):
    result, _, _ = _fallback(detector, output_samples=32)
    report = result.report
    space, agreement = report.output_space, report.agreement
    assert space is not None and agreement is not None
    assert space.metric == "decision_agreement" and space.n_batches == 2 and space.n_samples == 32
    assert set(space.ranking[:2]) == set(md.CULPRITS)
    assert all(space.values[n] == 1.0 for n in report.ranking if n not in md.CULPRITS)  # boxes flip nothing
    assert set(agreement.only_output) == set(md.CULPRITS) and agreement.spearman < 0
    assert set(report.fused_ranking[:4]) >= set(md.CULPRITS)
    assert result.plan.ranking == report.fused_ranking and set(result.plan.exclude) == set(md.CULPRITS)
