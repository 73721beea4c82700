"""Two rankings of the same layers: how far they agree, and one ranking fused from both.

The mode's ranking (e.g. local: each layer's own output error) and the output-space ranking (each
layer alone in INT8, scored on the model's outputs) see different things: a layer with a small own
error whose outputs feed a threshold ranks last locally and first in output space. The search
walks their reciprocal-rank fusion (G. V. Cormack, C. L. A. Clarke, S. Buettcher, "Reciprocal Rank
Fusion outperforms Condorcet and individual Rank Learning Methods", SIGIR 2009) with a small
constant, so the top layers of either ranking lead the fused one.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from quantdbg._json import Serializable
from quantdbg.errors import ConfigError

FUSION_K = 1
"""Reciprocal-rank fusion constant: score ``1/(k + rank_a) + 1/(k + rank_b)``. Small on purpose:
with the customary 60, a layer first in one ranking and last in the other sinks to the middle of a
short ranking; with 1, a ranking's first layer comes right after the layers both put near the top."""

TOP_K = 5
"""Size of the top lists the agreement compares (at most the number of layers)."""


def _positions(first: Sequence[str], second: Sequence[str]) -> tuple[dict[str, int], dict[str, int]]:
    a = {name: i + 1 for i, name in enumerate(first)}
    b = {name: i + 1 for i, name in enumerate(second)}
    if set(a) != set(b) or len(a) != len(first) or len(b) != len(second):
        raise ConfigError("The two rankings must order the same layers, each once; got "
                          f"{len(first)} and {len(second)} names, {len(set(a) ^ set(b))} in only one.")
    return a, b


def fuse_rankings(first: Sequence[str], second: Sequence[str], k: float = FUSION_K) -> tuple[str, ...]:
    """Reciprocal-rank fusion of two rankings of the same layers, most sensitive first.

    Ties (equal fused score) go to the better of the two ranks, then to ``first``'s order.

    Raises:
        ConfigError: The rankings do not hold the same names, each once.
    """
    a, b = _positions(first, second)
    return tuple(sorted(first, key=lambda n: (-(1.0 / (k + a[n]) + 1.0 / (k + b[n])), min(a[n], b[n]), a[n])))


def rank_correlation(first: Sequence[str], second: Sequence[str]) -> float:
    """Spearman's rank correlation of two rankings of the same layers (1.0 for fewer than two).

    Raises:
        ConfigError: The rankings do not hold the same names, each once.
    """
    a, b = _positions(first, second)
    n = len(a)
    if n < 2:
        return 1.0
    squares = sum((a[name] - b[name]) ** 2 for name in a)
    return 1.0 - 6.0 * squares / (n * (n * n - 1))


@dataclass(frozen=True)
class RankAgreement(Serializable):
    """Where the mode's ranking and the output-space ranking disagree.

    Attributes:
        spearman: Spearman's rank correlation (1: same order, -1: reversed).
        top_k: Size of the compared top lists.
        only_mode: Layers in the mode's top ``top_k`` but not in the output-space top, in the mode's order.
        only_output: Layers in the output-space top ``top_k`` but not in the mode's, in that order.
    """

    spearman: float
    top_k: int
    only_mode: tuple[str, ...]
    only_output: tuple[str, ...]


def rank_agreement(mode: Sequence[str], output: Sequence[str], top_k: int = TOP_K) -> RankAgreement:
    """How far the mode's ranking and the output-space ranking agree.

    Raises:
        ConfigError: The rankings do not hold the same names, each once.
    """
    k = min(top_k, len(mode))
    top_mode, top_output = set(mode[:k]), set(output[:k])
    return RankAgreement(rank_correlation(mode, output), k, tuple(n for n in mode[:k] if n not in top_output),
                         tuple(n for n in output[:k] if n not in top_mode))


__all__ = ["FUSION_K", "TOP_K", "RankAgreement", "fuse_rankings", "rank_agreement", "rank_correlation"]
