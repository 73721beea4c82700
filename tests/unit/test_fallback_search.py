"""The ``auto`` search (gallop up to a share, every layer out of INT8, group testing) on synthetic evaluate
functions with a planted set, its documented bound and budget, and its configuration."""
from __future__ import annotations

import itertools
import json
import logging
import math

import numpy as np
import pytest

from quantdbg.errors import ConfigError, FormatError
from quantdbg.fallback import FallbackConfig, FallbackTarget, SearchConfig, search_fallback
from quantdbg.fallback.budget import (
    default_budget,
    gallop_sizes,
    group_testing_bound,
    planned_culprits,
    search_bound,
)
from quantdbg.fallback.group import quickxplain
from quantdbg.fallback.ledger import BudgetExhausted, Ledger
from quantdbg.sensitivity import LayerSensitivity, SensitivityReport
from quantdbg.sensitivity.output_space import OutputSpace

TARGET = FallbackTarget.min_metric(0.5)
EXCHANGE = SearchConfig(exchange=True)  # the exchange phase (off by default)


class Planted:
    """Monotone by construction: met (1.0) iff every planted layer is out of INT8, else 0.0."""

    def __init__(self, planted: set[str]) -> None:
        self.planted = frozenset(planted)
        self.calls: list[frozenset[str]] = []

    def __call__(self, exclude: frozenset[str]) -> float:
        self.calls.append(frozenset(exclude))
        return 1.0 if self.planted <= exclude else 0.0


def _names(n: int) -> list[str]:
    return [f"n{i}" for i in range(n)]


# ----- the bound ---------------------------------------------------------------------------------

def test_bound_formulas_by_hand():
    assert gallop_sizes(64) == (1, 2, 4, 8, 16)  # S = 16: ceil(log2 16) + 1 = 5 prefixes
    assert gallop_sizes(52) == (1, 2, 4, 8, 13)
    assert gallop_sizes(3) == (1,) and gallop_sizes(1) == (1,) and gallop_sizes(10, 1.0) == (1, 2, 4, 8, 10)
    assert group_testing_bound(64, 1) == 2 * 6 + 2
    assert group_testing_bound(64, 4) == 8 * 4 + 8
    assert group_testing_bound(19, 3) == 6 * 3 + 6  # ceil(log2(6.33)) = 3
    assert search_bound(64, 4) == 5 + 1 + 40 + 3  # + k - 1 exchange evaluations proving the set the smallest
    assert planned_culprits(64) == 7 and planned_culprits(20) == 4 and planned_culprits(3) == 3
    assert default_budget(64, "auto") == search_bound(64, 7) == 5 + 1 + 14 * 4 + 14 + 6
    assert default_budget(64) == default_budget(64, "bisect") == math.floor(2 * math.log2(64) + 2)
    with pytest.raises(ConfigError, match=r"^The number of culprits k must be in 1\.\.8 \(the layers\), "
                                          r"got 9\.$"):
        group_testing_bound(8, 9)


@pytest.mark.parametrize("n_layers", [5, 12, 19])
def test_group_testing_stays_within_its_bound_for_every_planted_set(n_layers):
    names = _names(n_layers)
    for k in (1, 2, 3):
        for planted in itertools.combinations(names, k):
            evaluate = Planted(set(planted))
            ledger = Ledger(evaluate, TARGET, {n: i for i, n in enumerate(names)}, 10**6)
            ledger.failing.append(frozenset())  # what the search establishes before group testing
            ledger.passing.append(frozenset(names))
            found = quickxplain(ledger, names)
            assert found == frozenset(planted)
            assert len(evaluate.calls) <= group_testing_bound(n_layers, k)


def _orders(rng: np.random.Generator, names: list[str], planted: set[str]) -> list[list[str]]:
    """A random ranking, one with the planted layers last, one with them spread evenly."""
    shuffled = list(rng.permutation(names))
    last = [n for n in shuffled if n not in planted] + sorted(planted)
    others = [n for n in shuffled if n not in planted]
    spread = list(others)
    for j, node in enumerate(sorted(planted)):
        spread.insert((j + 1) * len(names) // (len(planted) + 1), node)
    return [shuffled, last, spread]


@pytest.mark.parametrize("seed", range(25))
def test_budget_property_random_planted_sets(seed):
    rng = np.random.default_rng(seed)
    names = _names(64)
    for k in (1, 2, 3, 4):
        planted = set(rng.choice(names, k, replace=False))
        for order in _orders(rng, names, planted):
            evaluate = Planted(planted)
            plan = search_fallback(order, evaluate, TARGET, EXCHANGE, verify=lambda exclude: 1.0)
            assert plan.status == "met"
            assert set(plan.exclude) == planted  # the unique minimal set, whatever its ranks
            assert plan.minimal
            assert plan.n_evaluations == len(evaluate.calls) <= search_bound(64, k) <= plan.budget
            assert plan.phases.get("exchange", 0) <= k - 1  # planted layers shown essential, then done
            assert len(set(evaluate.calls)) == len(evaluate.calls)  # nothing evaluated twice


class Alternatives:
    """Monotone: met iff every layer of one of the ``sets`` is out of INT8."""

    def __init__(self, *sets: set[str]) -> None:
        self.sets = [frozenset(s) for s in sets]
        self.calls: list[frozenset[str]] = []

    def __call__(self, exclude: frozenset[str]) -> float:
        self.calls.append(frozenset(exclude))
        return 1.0 if any(s <= exclude for s in self.sets) else 0.0


@pytest.mark.parametrize("seed", range(12))
def test_exchanges_find_a_smaller_set_than_the_first_irreducible_one(seed):
    """Two alternative culprit sets: the top-ranked one is what group testing finds first; a smaller
    one sits anywhere else in the ranking. Three layers for one (a drop-two-add-one exchange), and
    four layers for two that only help together (neither alone gains anything)."""
    rng = np.random.default_rng(seed)
    names = list(rng.permutation(_names(64)))
    deep = [str(n) for n in rng.choice(names[8:], 2, replace=False)]
    for first, smaller in ((set(names[:3]), {deep[0]}), (set(names[:4]), set(deep))):
        evaluate = Alternatives(first, smaller)
        without = search_fallback(names, Alternatives(first, smaller), TARGET, verify=lambda exclude: 1.0)
        assert set(without.exclude) == first and without.minimal  # irreducible, not the smallest
        assert "exchange" not in without.phases  # off by default
        plan = search_fallback(names, evaluate, TARGET, EXCHANGE, verify=lambda exclude: 1.0)
        assert plan.status == "met" and set(plan.exclude) == smaller and plan.minimal
        assert plan.n_evaluations == len(evaluate.calls) <= plan.budget == default_budget(64, "auto")
        assert len(set(evaluate.calls)) == len(evaluate.calls)
        # the smaller set, once found, is shown the smallest: its layers are essential
        assert plan.evaluations[-2].purpose == "exchange"


def test_exchanges_stop_when_a_round_finds_nothing_smaller():
    names = _names(32)
    evaluate = Alternatives({"n0", "n1"}, {"n20", "n21"})  # two sets of two: no exchange helps
    plan = search_fallback(names, evaluate, TARGET, EXCHANGE, verify=lambda exclude: 1.0)
    assert set(plan.exclude) == {"n0", "n1"} and plan.status == "met"
    assert plan.n_evaluations < plan.budget  # stopped, with budget left
    exchange = [set(e.exclude) for e in plan.evaluations if e.purpose == "exchange"]
    assert exchange[:2] == [set(names) - {"n0"}, set(names) - {"n1"}]  # neither essential: exchanges ran


def test_the_exchange_phase_keeps_to_the_budget():
    names = _names(64)
    evaluate = Alternatives(set(names[:4]), {"n40", "n50"})
    plan = search_fallback(names, evaluate, TARGET, SearchConfig(max_evaluations=20, exchange=True),
                           verify=lambda exclude: 1.0)
    assert plan.n_evaluations == len(evaluate.calls) == 20
    assert plan.status == "met" and len(plan.exclude) <= 4
    assert evaluate(frozenset(plan.exclude)) == 1.0


def test_no_set_is_evaluated_when_monotonicity_decides_it():
    names = _names(40)
    evaluate = Planted({"n3", "n17", "n39"})
    search_fallback(names, evaluate, TARGET, verify=lambda exclude: 1.0)
    for i, later in enumerate(evaluate.calls):
        earlier = evaluate.calls[:i]
        assert not any(later <= s for s in earlier if not evaluate.planted <= s)
        assert not any(s <= later for s in earlier if evaluate.planted <= s)


# ----- the phases ----------------------------------------------------------------------------------

def test_a_prefix_within_the_share_is_minimised_by_group_testing():
    names = _names(32)
    plan = search_fallback(names, Planted({"n0", "n5"}), TARGET, EXCHANGE)  # passing prefix: 8 of the 8 tried
    assert plan.exclude == ("n0", "n5") and plan.minimal
    assert [len(e.exclude) for e in plan.evaluations if e.purpose == "search"] == [1, 2, 4, 8]
    assert all(len(e.exclude) < len(names) for e in plan.evaluations)  # never every layer out of INT8
    assert list(plan.phases) == ["search", "group", "exchange", "verify"]
    # the exchange phase: every layer but n0 out of INT8 misses, so n0 is essential and the set of two
    # is a smallest one
    assert [(set(e.exclude), e.met) for e in plan.evaluations if e.purpose == "exchange"] == [
        (set(names) - {"n0"}, False)]


def test_culprits_beyond_the_share_are_found_by_group_testing():
    names = _names(16)
    plan = search_fallback(names, Planted({"n14", "n15"}), TARGET)
    search = [e for e in plan.evaluations if e.purpose == "search"]
    assert [len(e.exclude) for e in search] == [1, 2, 4, 16]  # gallop up to S = 4, then every layer
    assert plan.exclude == ("n14", "n15")
    assert plan.message == ("2 of 16 node(s) out of INT8 meet metric >= 0.5 (verified value 1, 4 search + "
                            f"{plan.phases['group']} group evaluations + 1 verification).")


def test_rounds_mark_the_gallop_as_one_round():
    plan = search_fallback(_names(16), Planted({"n14", "n15"}), TARGET)
    rounds = [(e.purpose, len(e.exclude), e.round) for e in plan.evaluations]
    assert rounds[:4] == [("search", 1, 1), ("search", 2, 1), ("search", 4, 1), ("search", 16, 2)]
    later = [r for _, _, r in rounds[4:]]
    assert later == list(range(3, 3 + len(later)))  # group testing and verification: one round each
    assert plan.evaluations[-1].purpose == "verify"


def test_int8_already_meeting_the_target_gives_an_empty_set():
    plan = search_fallback(["a", "b", "c"], lambda exclude: 1.0, TARGET)
    assert plan.status == "met" and plan.exclude == () and plan.minimal
    assert [(len(e.exclude), e.purpose) for e in plan.evaluations] == [(1, "search"), (0, "search"),
                                                                        (0, "verify")]


def test_unreachable_target_reports_the_best_achieved():
    names = _names(8)
    plan = search_fallback(names, lambda exclude: 0.1 + 0.01 * len(exclude), TARGET)
    assert plan.status == "unreachable" and plan.exclude == tuple(names)
    assert [len(e.exclude) for e in plan.evaluations] == [1, 2, 8]
    assert plan.message == ("Target metric >= 0.5 is unreachable: even all 8 ranked nodes out of INT8 miss "
                            "it; best achieved 0.18 with 8 node(s) out of INT8.")


def test_budget_running_out_before_any_set_passes_is_unreachable():
    plan = search_fallback(_names(16), Planted({"n15"}), TARGET, max_evaluations=2)
    assert plan.status == "unreachable" and plan.n_evaluations == 2
    assert plan.message.startswith("Target metric >= 0.5 is unreachable: the budget of 2 evaluations ran out "
                                   "before any set met the target; best achieved 0 with 1 node(s)")


def test_budget_running_out_in_group_testing_keeps_the_smallest_passing_set():
    names = _names(16)
    plan = search_fallback(names, Planted({"n9", "n14"}), TARGET, max_evaluations=6)
    assert plan.status == "budget_exhausted" and not plan.minimal
    assert plan.n_evaluations == 6
    passing = [e for e in plan.evaluations if e.met and e.purpose != "verify"]
    assert len(plan.exclude) == min(len(e.exclude) for e in passing)
    largest_failing = max(len(e.exclude) for e in plan.evaluations if not e.met and
                          len(e.exclude) < len(plan.exclude))
    assert plan.message == (
        f"The budget of 6 evaluations ran out before the set was minimal: no evaluated set of <= "
        f"{largest_failing} layers met metric >= 0.5; best: {len(plan.exclude)} layers -> 1. Verified "
        f"value 1 (4 search + 2 group evaluations + 1 verification).")


def test_patience_leaves_a_flat_gallop_early(caplog):
    names = _names(64)
    evaluate = Planted({"n60"})
    with caplog.at_level(logging.INFO, logger="quantdbg.fallback.group"):
        plan = search_fallback(names, evaluate, TARGET, SearchConfig(patience=2))
    assert [len(e.exclude) for e in plan.evaluations if e.purpose == "search"] == [1, 2, 4, 64]
    assert ("2 ranked prefixes in a row did not improve on 0; leaving the gallop at 4 of 64 layers"
            in caplog.text)
    assert plan.exclude == ("n60",)


# ----- rankings and configuration ----------------------------------------------------------------

def _report() -> SensitivityReport:
    layers = tuple(LayerSensitivity(n, "MatMul", (), i + 1, -float(i), float(i))
                   for i, n in enumerate("abcd"))
    space = OutputSpace("sqnr", True, 1, 4, {n: 1.0 for n in "abcd"}, {n: 1.0 for n in "abcd"},
                        ("d", "c", "b", "a"))
    return SensitivityReport("local", "local sqnr (dB)", True, layers, output_space=space)


def test_auto_walks_the_fused_ranking_and_bisect_the_modes():
    report = _report()
    assert report.fused_ranking == ("a", "d", "b", "c")
    auto = search_fallback(report, Planted({"c"}), TARGET)
    assert auto.ranking == report.fused_ranking
    bisect = search_fallback(report, Planted({"c"}), TARGET, "bisect")
    assert bisect.ranking == report.ranking == ("a", "b", "c", "d")


def test_search_config_validation_and_round_trip():
    for config in (SearchConfig(), SearchConfig("bisect", 9, 0.5, 3)):
        assert SearchConfig.from_dict(json.loads(json.dumps(config.to_dict()))) == config
    assert SearchConfig().budget(64) == default_budget(64, "auto")
    assert SearchConfig(max_evaluations=3).budget(64) == 3
    assert FallbackConfig(strategy="linear", max_evaluations=4, gallop_share=0.5).search == \
        SearchConfig("linear", 4, 0.5, None)
    with pytest.raises(ConfigError, match=r"^gallop_share is the share of the layers the gallop may keep out "
                                          r"of INT8, in \(0, 1\]; got 0\.0\.$"):
        SearchConfig(gallop_share=0.0)
    with pytest.raises(ConfigError, match=r"^patience must be >= 1 or None \(walk every prefix up to the "
                                          r"share\), got 0\.$"):
        FallbackConfig(patience=0)
    with pytest.raises(ConfigError, match=r"^Give the budget once: in the SearchConfig"):
        search_fallback(["a"], Planted({"a"}), TARGET, SearchConfig(), max_evaluations=3)
    with pytest.raises(ConfigError, match=r"^max_evaluations must be >= 1, got 0\.$"):
        search_fallback(["a"], Planted({"a"}), TARGET, max_evaluations=0)
    with pytest.raises(FormatError, match=r"field 'gallop_share': expected a number"):
        SearchConfig.from_dict({"gallop_share": "a quarter"})
    config = FallbackConfig(gallop_share=0.1, patience=2)
    assert FallbackConfig.from_dict(json.loads(json.dumps(config.to_dict()))) == config


# ----- the ledger --------------------------------------------------------------------------------

def test_ledger_decides_by_monotonicity_counts_and_marks_rounds():
    evaluate = Planted({"b"})
    ledger = Ledger(evaluate, TARGET, {"a": 0, "b": 1, "c": 2}, budget=2, marking=True)
    with ledger.shared_round():
        assert ledger.met(frozenset({"a"}), "search") is False
        assert ledger.met(frozenset({"c", "b"}), "search") is True
    assert ledger.met(frozenset(), "group") is False  # decided by monotonicity: no evaluation
    assert ledger.met(frozenset("abc"), "group") is True
    assert ledger.known(frozenset({"c"})) is None and len(evaluate.calls) == 2
    with pytest.raises(BudgetExhausted):
        ledger.met(frozenset({"c"}), "group")
    assert [(e.exclude, e.purpose, e.round) for e in ledger.log] == [(("a",), "search", 1),
                                                                     (("b", "c"), "search", 1)]
    assert ledger.value(frozenset({"b", "c"})) == 1.0 and ledger.value(frozenset({"c"})) is None
    assert ledger.smallest_passing() == frozenset({"b", "c"}) and ledger.best() == ledger.log[1]
    assert ledger.verification(("b", "c"), 1.0, True).round == 2
