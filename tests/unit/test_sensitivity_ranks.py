"""Two rankings of the same layers: reciprocal-rank fusion, Spearman's correlation and the top-k differences,
against independent computations."""
from __future__ import annotations

import json

import numpy as np
import pytest

from quantdbg.errors import ConfigError
from quantdbg.sensitivity.ranks import (
    FUSION_K,
    RankAgreement,
    fuse_rankings,
    rank_agreement,
    rank_correlation,
)


def _rrf_oracle(first: list[str], second: list[str], k: float) -> list[str]:
    score = {n: 0.0 for n in first}
    for ranking in (first, second):
        for position, node in enumerate(ranking, start=1):
            score[node] += 1.0 / (k + position)
    best = {n: min(first.index(n), second.index(n)) for n in first}
    return sorted(first, key=lambda n: (-score[n], best[n], first.index(n)))


@pytest.mark.parametrize("seed", range(10))
def test_fusion_matches_an_independent_reciprocal_rank_fusion(seed):
    rng = np.random.default_rng(seed)
    first = [f"n{i}" for i in range(int(rng.integers(1, 30)))]
    second = list(rng.permutation(first))
    assert list(fuse_rankings(first, second)) == _rrf_oracle(first, second, FUSION_K)
    assert list(fuse_rankings(first, second, 60)) == _rrf_oracle(first, second, 60)


def test_fusion_by_hand_puts_the_top_of_either_ranking_first():
    local = ["a", "b", "c", "d", "e", "f"]
    output = ["f", "b", "c", "d", "e", "a"]  # f: last locally, first in output space
    # scores with k = 1: b 2/3, a = f = 1/2 + 1/7 (tie: best rank 1 both; a first locally), c 1/2, ...
    assert fuse_rankings(local, output) == ("b", "a", "f", "c", "d", "e")
    assert fuse_rankings(local, local) == tuple(local)


@pytest.mark.parametrize("seed", range(10))
def test_rank_correlation_is_pearsons_on_the_positions(seed):
    rng = np.random.default_rng(seed)
    first = [f"n{i}" for i in range(int(rng.integers(2, 40)))]
    second = list(rng.permutation(first))
    positions_a = np.arange(len(first))
    positions_b = np.array([second.index(n) for n in first])
    assert rank_correlation(first, second) == pytest.approx(np.corrcoef(positions_a, positions_b)[0, 1])
    assert rank_correlation(first, first) == 1.0
    assert rank_correlation(first, first[::-1]) == pytest.approx(-1.0)
    assert rank_correlation(["a"], ["a"]) == 1.0


def test_agreement_lists_what_one_top_k_holds_and_the_other_does_not():
    mode = ["a", "b", "c", "d", "e", "f", "g"]
    output = ["g", "a", "f", "b", "c", "d", "e"]
    agreement = rank_agreement(mode, output, top_k=3)
    assert agreement == RankAgreement(rank_correlation(mode, output), 3, ("b", "c"), ("g", "f"))
    assert rank_agreement(["a", "b"], ["b", "a"]).top_k == 2  # at most the number of layers
    assert RankAgreement.from_dict(json.loads(json.dumps(agreement.to_dict()))) == agreement


def test_rankings_of_other_layers_are_refused():
    with pytest.raises(ConfigError, match=r"^The two rankings must order the same layers, each once; got 2 "
                                          r"and 2 names, 2 in only one\.$"):
        fuse_rankings(["a", "b"], ["a", "c"])
    with pytest.raises(ConfigError, match=r"^The two rankings must order the same layers, each once; got 3 "
                                          r"and 2 names, 0 in only one\.$"):
        rank_correlation(["a", "b", "a"], ["a", "b"])
