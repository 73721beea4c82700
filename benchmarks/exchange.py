"""The exchange phase of the ``auto`` fallback search on synthetic additive metrics: what it costs and
what it finds (the measurement behind ``quantdbg.fallback.budget.EXCHANGE_DEFAULT``).

Each run: ``L`` layers, each losing a log-normal amount of metric in INT8 (plus, optionally, a few
pairs that lose more only together); the ranking the search walks is the true order blurred by a
log-normal factor; the target leaves a fraction of the total loss. The search runs with the exchange
phase off, with it on, and with it capped at the search's own evaluations.

    python benchmarks/exchange.py            # 52 layers, 40 seeds per setting
"""
from __future__ import annotations

import argparse
from collections.abc import Callable

import numpy as np

from quantdbg.fallback import FallbackTarget, SearchConfig, search_fallback
from quantdbg.fallback import search as search_module

Score = Callable[[frozenset[str]], float]


def problem(seed: int, n_layers: int, blur: float, left: float, pairs: int
            ) -> tuple[list[str], Score, FallbackTarget]:
    """The ranking, the metric and the target of one synthetic run."""
    rng = np.random.default_rng(seed)
    names = [f"n{i}" for i in range(n_layers)]
    loss = dict(zip(names, rng.lognormal(0, 1.5, n_layers), strict=True))
    joint = {tuple(rng.choice(names, 2, replace=False)): rng.lognormal(0, 1.5) for _ in range(pairs)}

    def metric(exclude: frozenset[str]) -> float:
        quantized = set(names) - exclude
        return -(sum(loss[n] for n in quantized) + sum(v for (a, b), v in joint.items()
                                                       if a in quantized and b in quantized))

    total = sum(loss.values()) + sum(joint.values())
    ranking = sorted(names, key=lambda n: -loss[n] * np.exp(rng.normal(0, blur)))
    return ranking, metric, FallbackTarget.min_metric(-left * total)


def capped(share: float) -> Callable[..., frozenset[str]]:
    """The exchange phase allowed at most ``share`` times the evaluations the search made before it."""
    shrink = search_module.shrink

    def run(ledger, names, chosen):  # noqa: ANN001, ANN202
        budget = ledger.budget
        ledger.budget = min(budget, ledger.n_search + max(1, int(share * ledger.n_search)))
        try:
            return shrink(ledger, names, chosen)
        finally:
            ledger.budget = budget
    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=52)
    parser.add_argument("--seeds", type=int, default=40)
    args = parser.parse_args()
    plain = search_module.shrink
    print("| blur | loss left | joint pairs | off: layers, evaluations | on: layers, evaluations (exchange) "
          "| capped at 1x: layers, evaluations | runs with a smaller set (on) |")
    print("|---|---|---|---|---|---|---|")
    for blur in (0.5, 1.0):
        for left in (0.05, 0.2, 0.5):
            for pairs in (0, 3):
                rows = []
                for seed in range(args.seeds):
                    ranking, metric, target = problem(seed, args.layers, blur, left, pairs)
                    found = []
                    for exchange, shrink in ((False, plain), (True, plain), (True, capped(1.0))):
                        search_module.shrink = shrink
                        plan = search_fallback(ranking, metric, target, SearchConfig(exchange=exchange),
                                               verify=metric)
                        found += [len(plan.exclude), plan.n_evaluations, plan.phases.get("exchange", 0)]
                    search_module.shrink = plain
                    rows.append(found)
                a = np.array(rows, float).mean(axis=0)
                smaller = np.mean([r[3] < r[0] for r in rows])
                print(f"| {blur} | {left:.0%} | {pairs} | {a[0]:.2f}, {a[1]:.1f} | {a[3]:.2f}, {a[4]:.1f} "
                      f"({a[5]:.1f}) | {a[6]:.2f}, {a[7]:.1f} | {smaller:.0%} |")


if __name__ == "__main__":
    main()
