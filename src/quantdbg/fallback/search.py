"""Search for the smallest set of layers to keep out of INT8 (FP16 fallback).

:func:`search_fallback` walks a sensitivity ranking: it gallops over ranked prefixes (1, 2, 4, ...
nodes) until the target holds, bisects between the last failing and the first passing prefix,
then greedily drops nodes from the set while the target still holds. Every call of the user's
``evaluate`` is a *full evaluation* and is counted; results that follow from monotonicity (a
subset of a failing set fails, a superset of a passing set passes) are never re-evaluated. The
default budget is ``floor(2 log2(L) + 2)`` evaluations for ``L`` ranked layers, plus one
verification of the final set (by default on the real mixed-precision model).
"""
from __future__ import annotations

import logging
import math
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, get_args

import numpy as np

from quantdbg._io import write_json_atomic
from quantdbg.config import Precision
from quantdbg.errors import ConfigError, QuantDbgError
from quantdbg.evaluation import float_to_json, json_float

if TYPE_CHECKING:
    from quantdbg.backends import RunnerFactory
    from quantdbg.data import DataSource
    from quantdbg.evaluation import MetricName, TaskMetric
    from quantdbg.model import ModelSource
    from quantdbg.qdq import QuantizedModel
    from quantdbg.sensitivity import Mode, SensitivityReport

logger = logging.getLogger(__name__)

TargetKind = Literal["metric", "relative_loss", "sqnr"]
Strategy = Literal["bisect", "linear"]
PlanStatus = Literal["met", "unreachable", "verification_failed"]
Purpose = Literal["search", "prune", "verify"]
_KINDS: tuple[str, ...] = get_args(TargetKind)
_STRATEGIES: tuple[str, ...] = get_args(Strategy)
PLAN_FORMAT = "quantdbg.fallback_plan/1"


@dataclass(frozen=True)
class FallbackTarget:
    """What the mixed-precision model must achieve.

    Attributes:
        kind: ``"metric"``: task metric at least ``threshold`` (at most, when lower is better);
            ``"relative_loss"``: loss against the FP32 ``reference`` at most ``threshold`` percent;
            ``"sqnr"``: output SQNR at least ``threshold`` dB.
        threshold: The bound.
        lower_is_better: Direction of the task metric (``"metric"``/``"relative_loss"`` only).
        reference: The FP32 model's task metric (required by ``"relative_loss"``).

    Raises:
        ConfigError: Unknown kind, non-finite threshold, a negative loss bound, or
            ``lower_is_better`` with an SQNR target.
    """

    kind: TargetKind
    threshold: float
    lower_is_better: bool = False
    reference: float | None = None

    def __post_init__(self) -> None:
        if self.kind not in _KINDS:
            raise ConfigError(f"Unknown target kind {self.kind!r}; choose one of {', '.join(_KINDS)}.")
        if not math.isfinite(self.threshold):
            raise ConfigError(f"The target threshold must be finite, got {self.threshold}.")
        if self.kind == "relative_loss" and self.threshold < 0:
            raise ConfigError(f"A relative-loss bound is a percentage >= 0, got {self.threshold}.")
        if self.kind == "sqnr" and self.lower_is_better:
            raise ConfigError("An SQNR target is always higher-is-better; drop lower_is_better.")
        if self.reference is not None and not math.isfinite(self.reference):
            raise ConfigError(f"The reference metric must be finite, got {self.reference}.")

    @classmethod
    def min_metric(cls, value: float, lower_is_better: bool = False) -> FallbackTarget:
        """Task metric >= ``value`` (<= when ``lower_is_better``)."""
        return cls("metric", float(value), lower_is_better)

    @classmethod
    def max_relative_loss(cls, percent: float, reference: float | None = None,
                          lower_is_better: bool = False) -> FallbackTarget:
        """Task metric within ``percent`` % of the FP32 ``reference``."""
        return cls("relative_loss", float(percent), lower_is_better, reference)

    @classmethod
    def min_sqnr(cls, db: float) -> FallbackTarget:
        """Output SQNR >= ``db`` dB."""
        return cls("sqnr", float(db))

    @property
    def higher_is_better(self) -> bool:
        """Direction of the value ``evaluate`` returns."""
        return not self.lower_is_better

    def with_reference(self, reference: float) -> FallbackTarget:
        """The same target with the FP32 reference metric filled in."""
        return FallbackTarget(self.kind, self.threshold, self.lower_is_better, float(reference))

    def relative_loss(self, value: float) -> float:
        """Loss of ``value`` against the reference, in percent (negative when better).

        Raises:
            ConfigError: No reference is set.
        """
        if self.reference is None:
            raise ConfigError("A relative-loss target needs the FP32 reference metric; build it with "
                              "FallbackTarget.max_relative_loss(pct, reference=...).")
        drop = value - self.reference if self.lower_is_better else self.reference - value
        return 100.0 * drop / max(abs(self.reference), 1e-12)

    def is_met(self, value: float) -> bool:
        """True when ``value`` (what ``evaluate`` returned) satisfies the target."""
        if math.isnan(value):
            return False
        if self.kind == "relative_loss":
            return self.relative_loss(value) <= self.threshold
        return value <= self.threshold if self.lower_is_better else value >= self.threshold

    def better(self, a: float, b: float) -> bool:
        """True when value ``a`` is strictly better than ``b``."""
        if math.isnan(b):
            return not math.isnan(a)
        return a < b if self.lower_is_better else a > b

    def describe(self) -> str:
        """E.g. ``metric >= 0.99`` or ``relative loss <= 1 % of 0.339``."""
        if self.kind == "relative_loss":
            ref = "?" if self.reference is None else f"{self.reference:.6g}"
            return f"relative loss <= {self.threshold:g} % of {ref}"
        if self.kind == "sqnr":
            return f"output SQNR >= {self.threshold:g} dB"
        return f"metric {'<=' if self.lower_is_better else '>='} {self.threshold:g}"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return {"kind": self.kind, "threshold": self.threshold, "lower_is_better": self.lower_is_better,
                "reference": self.reference}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> FallbackTarget:
        """Inverse of :meth:`to_dict`."""
        return cls(data["kind"], float(data["threshold"]), bool(data.get("lower_is_better", False)),
                   data.get("reference"))


@dataclass(frozen=True)
class FallbackEvaluation:
    """One call of ``evaluate`` (or of the verification).

    Attributes:
        nodes: The fallback set evaluated, in rank order.
        value: What it returned.
        met: Whether the target held.
        purpose: ``"search"`` (prefix gallop/bisection), ``"prune"`` or ``"verify"``.
    """

    nodes: tuple[str, ...]
    value: float
    met: bool
    purpose: Purpose

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return {"nodes": list(self.nodes), "value": float_to_json(self.value), "met": self.met,
                "purpose": self.purpose}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> FallbackEvaluation:
        """Inverse of :meth:`to_dict`."""
        return cls(tuple(data["nodes"]), json_float(data["value"]), bool(data["met"]),
                   data["purpose"])


@dataclass(frozen=True)
class TensorRTSettings:
    """What a TensorRT build of the mixed-precision model needs.

    Attributes:
        strongly_typed: Build with ``--stronglyTyped``: precisions come from the graph (Q/DQ pairs
            are INT8, fallback nodes compute in the FP16 the model's casts say).
        builder_flags: For a weakly typed build instead: the precisions to enable.
        layer_precisions: Fallback node -> precision, for ``--layerPrecisions`` together with
            ``--precisionConstraints=obey`` in a weakly typed build (TensorRT names the layers
            of an ONNX model after its node names).
    """

    strongly_typed: bool
    builder_flags: tuple[str, ...]
    layer_precisions: Mapping[str, str]

    def trtexec_args(self, onnx_path: str = "MIXED.onnx") -> list[str]:
        """The trtexec arguments of the build (strongly typed when set)."""
        args = ["trtexec", f"--onnx={onnx_path}"]
        if self.strongly_typed:
            return [*args, "--stronglyTyped"]
        args += [f"--{flag}" for flag in self.builder_flags]
        if self.layer_precisions:
            spec = ",".join(f"{k}:{v}" for k, v in self.layer_precisions.items())
            args += ["--precisionConstraints=obey", f"--layerPrecisions={spec}"]
        return args

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (with the ready trtexec command lines)."""
        weak = TensorRTSettings(False, self.builder_flags, self.layer_precisions)
        return {"strongly_typed": self.strongly_typed, "builder_flags": list(self.builder_flags),
                "layer_precisions": dict(self.layer_precisions),
                "trtexec": " ".join(self.trtexec_args()),
                "trtexec_weakly_typed": " ".join(weak.trtexec_args())}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TensorRTSettings:
        """Inverse of :meth:`to_dict`."""
        return cls(bool(data["strongly_typed"]), tuple(data["builder_flags"]), dict(data["layer_precisions"]))


@dataclass(frozen=True)
class FallbackPlan:
    """The result of a fallback search.

    Attributes:
        status: ``"met"``; ``"unreachable"`` (even every ranked node out of INT8 misses the target;
            ``value`` is the best achieved); ``"verification_failed"`` (the search's set passed but
            the verification run of the final model did not).
        nodes: Nodes to keep out of INT8, in rank order.
        target: The target.
        value: The verified value of the final set (the best value seen when unreachable).
        strategy: Search strategy used.
        ranking: The ranking searched, most sensitive first.
        evaluations: Every evaluation, in order, the verification last.
        budget: Maximum number of search/prune evaluations allowed.
        minimal: True when no single node of ``nodes`` can be dropped (every removal was seen,
            or follows by monotonicity, to miss the target).
        precision: Precision the fallback nodes compute in.
        message: One human-readable sentence on the outcome.
        build: Once the mixed model is written: the TensorRT engine build of it
            (:class:`quantdbg.interop.EngineBuildSpec` and its trtexec / Polygraphy commands, as
            JSON-ready dicts), else None.
    """

    status: PlanStatus
    nodes: tuple[str, ...]
    target: FallbackTarget
    value: float
    strategy: Strategy
    ranking: tuple[str, ...]
    evaluations: tuple[FallbackEvaluation, ...]
    budget: int
    minimal: bool
    precision: Precision = Precision.FP16
    message: str = ""
    build: Mapping[str, Any] | None = None

    @property
    def n_evaluations(self) -> int:
        """Full evaluations made by the search (verification excluded)."""
        return sum(1 for e in self.evaluations if e.purpose != "verify")

    @property
    def nodes_to_exclude(self) -> list[str]:
        """ModelOpt's ``nodes_to_exclude`` argument (``modelopt.onnx.quantization.quantize``)."""
        return list(self.nodes)

    @property
    def tensorrt(self) -> TensorRTSettings:
        """Settings for a TensorRT build of the mixed model."""
        return TensorRTSettings(True, ("int8", self.precision.value),
                                {node: self.precision.value for node in self.nodes})

    def with_precision(self, precision: Precision) -> FallbackPlan:
        """The same plan with another fallback precision."""
        return replace(self, precision=Precision(precision))

    def with_build(self, model_path: str | os.PathLike, data: Any = None) -> FallbackPlan:
        """The same plan with the TensorRT build of the mixed model written at ``model_path``.

        Args:
            model_path: The mixed-precision model file.
            data: Feeds whose shapes give the optimization profile of dynamic inputs (e.g. the
                evaluation data); None uses batch 1/8/32 for batch-only dynamic inputs.

        Returns:
            The plan with :attr:`build` set (unchanged when no profile can be derived; the reason
            is logged).
        """
        from quantdbg.backends.tensorrt import EngineBuildSpec, build_commands

        path = Path(model_path)
        try:
            spec = EngineBuildSpec.from_model(path, shapes=_profile_from(data),
                                              engine=path.with_suffix(".engine"), fallback_nodes=self.nodes,
                                              fallback_precision=self.precision)
        except QuantDbgError as err:
            logger.warning("no TensorRT build commands in the plan: %s", err)
            return self
        return replace(self, build={"spec": spec.to_dict(), "commands": build_commands(spec).to_dict()})

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict, with ModelOpt's and TensorRT's settings included."""
        return {"format": PLAN_FORMAT, "status": self.status, "nodes": list(self.nodes),
                "target": self.target.to_dict(), "value": float_to_json(self.value),
                "strategy": self.strategy, "ranking": list(self.ranking),
                "evaluations": [e.to_dict() for e in self.evaluations], "n_evaluations": self.n_evaluations,
                "budget": self.budget, "minimal": self.minimal, "precision": self.precision.value,
                "message": self.message, "modelopt": {"nodes_to_exclude": self.nodes_to_exclude},
                "tensorrt": {**self.tensorrt.to_dict(),
                             "build": None if self.build is None else dict(self.build)}}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> FallbackPlan:
        """Inverse of :meth:`to_dict` (derived sections are recomputed, not read).

        Raises:
            ConfigError: ``data`` is not a fallback plan.
        """
        if data.get("format") != PLAN_FORMAT:
            raise ConfigError(f"Not a quantdbg fallback plan (format {data.get('format')!r}, expected "
                              f"{PLAN_FORMAT!r}).")
        return cls(data["status"], tuple(data["nodes"]), FallbackTarget.from_dict(data["target"]),
                   json_float(data["value"]), data["strategy"], tuple(data["ranking"]),
                   tuple(FallbackEvaluation.from_dict(e) for e in data["evaluations"]), int(data["budget"]),
                   bool(data["minimal"]), Precision(data["precision"]), data.get("message", ""),
                   data.get("tensorrt", {}).get("build"))

    def write(self, path: str | os.PathLike) -> Path:
        """Writes :meth:`to_dict` as JSON atomically."""
        return write_json_atomic(path, self.to_dict())


def _profile_from(data: Any) -> dict[str, Any]:
    """Min / opt (first feed) / max shapes of every input over the feeds of ``data``."""
    from quantdbg.backends.tensorrt import ShapeRange
    from quantdbg.data import as_data

    if data is None:
        return {}
    shapes: dict[str, list[tuple[int, ...]]] = {}
    for feed in as_data(data):
        for name, value in feed.items():
            shapes.setdefault(name, []).append(tuple(int(d) for d in np.shape(value)))
    return {name: ShapeRange(tuple(map(min, zip(*seen, strict=True))), seen[0],
                             tuple(map(max, zip(*seen, strict=True))))
            for name, seen in shapes.items() if len({len(s) for s in seen}) == 1}


def default_budget(n_layers: int) -> int:
    """``floor(2 log2(L) + 2)`` full evaluations for ``L`` ranked layers (2 for L <= 1)."""
    return int(math.floor(2 * math.log2(n_layers) + 2)) if n_layers > 1 else 2


class _BudgetExhausted(Exception):
    pass


@dataclass
class _Search:
    """Evaluation bookkeeping: cache, monotone inference, budget."""

    evaluate: Callable[[frozenset[str]], float]
    target: FallbackTarget
    order: Mapping[str, int]
    budget: int
    log: list[FallbackEvaluation] = field(default_factory=list)
    passing: list[frozenset[str]] = field(default_factory=list)
    failing: list[frozenset[str]] = field(default_factory=list)

    @property
    def n_search(self) -> int:
        return sum(1 for e in self.log if e.purpose != "verify")

    def known(self, nodes: frozenset[str]) -> bool | None:
        if any(p <= nodes for p in self.passing):
            return True
        if any(nodes <= f for f in self.failing):
            return False
        return None

    def met(self, nodes: frozenset[str], purpose: Purpose) -> bool:
        known = self.known(nodes)
        if known is not None:
            return known
        if self.n_search >= self.budget:
            raise _BudgetExhausted
        value = float(self.evaluate(nodes))
        ok = self.target.is_met(value)
        (self.passing if ok else self.failing).append(nodes)
        self.log.append(FallbackEvaluation(self.ranked(nodes), value, ok, purpose))
        logger.info("fallback: %d node(s) -> %.6g (%s)", len(nodes), value, "met" if ok else "missed")
        return ok

    def ranked(self, nodes: Iterable[str]) -> tuple[str, ...]:
        return tuple(sorted(nodes, key=self.order.__getitem__))

    def best(self) -> FallbackEvaluation | None:
        best = None
        for e in self.log:
            if best is None or self.target.better(e.value, best.value):
                best = e
        return best


def _ranking_names(ranking: SensitivityReport | Sequence[str]) -> tuple[str, ...]:
    names = tuple(ranking) if isinstance(ranking, Sequence) else tuple(ranking.ranking)
    if not names:
        raise ConfigError("The ranking is empty: there are no quantized layers to fall back.")
    if len(set(names)) != len(names):
        dup = next(n for n in names if names.count(n) > 1)
        raise ConfigError(f"The ranking lists node {dup!r} twice; give each layer once, most "
                          "sensitive first.")
    return names


def _smallest_prefix(search: _Search, names: tuple[str, ...], strategy: Strategy) -> int | None:
    """Length of the shortest passing prefix (assuming monotonicity), or None when none passes."""
    total = len(names)
    prefix = lambda k: frozenset(names[:k])  # noqa: E731
    if strategy == "linear":
        for k in range(1, total + 1):
            if search.met(prefix(k), "search"):
                return 0 if k == 1 and search.met(prefix(0), "search") else k
        return None
    lo, k = 0, 1  # prefix(lo) is not known to pass; gallop 1, 2, 4, ... then bisect
    while not search.met(prefix(k), "search"):
        if k == total:
            return None
        lo, k = k, min(2 * k, total)
    hi = k
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if search.met(prefix(mid), "search"):
            hi = mid
        else:
            lo = mid
    if hi == 1 and search.met(prefix(0), "search"):
        return 0
    return hi


def _prune(search: _Search, chosen: frozenset[str]) -> tuple[frozenset[str], bool]:
    """Greedy pruning, least sensitive node first; returns the set and whether it is 1-minimal."""
    for node in sorted(chosen, key=search.order.__getitem__, reverse=True):
        try:
            if search.met(chosen - {node}, "prune"):
                chosen = chosen - {node}
        except _BudgetExhausted:
            return chosen, all(search.known(chosen - {n}) is False for n in chosen)
    return chosen, True


def search_fallback(ranking: SensitivityReport | Sequence[str],
                    evaluate: Callable[[frozenset[str]], float], target: FallbackTarget,
                    strategy: Strategy = "bisect", *, max_evaluations: int | None = None,
                    verify: Callable[[frozenset[str]], float] | None = None) -> FallbackPlan:
    """Finds a small set of layers whose fallback out of INT8 meets ``target``.

    Args:
        ranking: A :class:`~quantdbg.sensitivity.SensitivityReport` or node names, most
            sensitive first.
        evaluate: ``evaluate(nodes) -> value``: the metric of the model with ``nodes`` out of INT8
            and every other ranked node quantized (a full evaluation). Assumed monotone: more
            fallback never hurts.
        target: What must hold (its ``kind`` says how ``value`` is read).
        strategy: ``"bisect"`` (gallop + bisection over ranked prefixes, then greedy pruning) or
            ``"linear"`` (the top-k baseline: prefixes 1, 2, 3, ..., no pruning).
        max_evaluations: Budget of search evaluations (default :func:`default_budget`).
        verify: Scores the final set once more, e.g. on the real mixed-precision model (default:
            ``evaluate`` again).

    Returns:
        The plan (status ``"unreachable"`` with the best value seen when even the whole ranking
        out of INT8 misses the target).

    Raises:
        ConfigError: Empty or duplicated ranking, unknown strategy, a budget < 1, or a
            relative-loss target without its reference.
    """
    names = _ranking_names(ranking)
    if strategy not in _STRATEGIES:
        raise ConfigError(f"Unknown fallback strategy {strategy!r}; choose one of {', '.join(_STRATEGIES)}.")
    if target.kind == "relative_loss" and target.reference is None:
        target.relative_loss(0.0)  # raises the ConfigError that explains the missing reference
    budget = default_budget(len(names)) if max_evaluations is None else int(max_evaluations)
    if budget < 1:
        raise ConfigError(f"max_evaluations must be >= 1, got {max_evaluations}.")
    search = _Search(evaluate, target, {n: i for i, n in enumerate(names)}, budget)
    try:
        k = _smallest_prefix(search, names, strategy)
    except _BudgetExhausted:
        k = None
    if k is None:
        return _unreachable(search, names, strategy)
    chosen, minimal = frozenset(names[:k]), False
    if strategy == "bisect":
        chosen, minimal = _prune(search, chosen)
    return _verified(search, names, chosen, minimal, strategy, verify or evaluate)


def _unreachable(search: _Search, names: tuple[str, ...], strategy: Strategy) -> FallbackPlan:
    best = search.best()
    value = math.nan if best is None else best.value
    nodes = names if best is None else best.nodes
    exhausted = not any(e.nodes == names for e in search.log)
    why = (f"the budget of {search.budget} evaluations ran out before any prefix met the target"
           if exhausted else f"even all {len(names)} ranked nodes out of INT8 miss it")
    message = f"Target {search.target.describe()} is unreachable: {why}; best achieved {value:.6g} " \
              f"with {len(nodes)} node(s) out of INT8."
    return FallbackPlan("unreachable", nodes, search.target, value, strategy, names, tuple(search.log),
                        search.budget, False, message=message)


def _verified(search: _Search, names: tuple[str, ...], chosen: frozenset[str], minimal: bool,
              strategy: Strategy, verify: Callable[[frozenset[str]], float]) -> FallbackPlan:
    value = float(verify(chosen))
    ok = search.target.is_met(value)
    nodes = search.ranked(chosen)
    search.log.append(FallbackEvaluation(nodes, value, ok, "verify"))
    status: PlanStatus = "met" if ok else "verification_failed"
    message = (f"{len(nodes)} of {len(names)} node(s) out of INT8 meet {search.target.describe()} "
               f"(verified value {value:.6g}, {search.n_search} evaluations + 1 verification)."
               if ok else f"The search's set of {len(nodes)} node(s) passed, but the verification run gave "
               f"{value:.6g}, which misses {search.target.describe()}; the evaluation used in the search "
               "differs from the verified model (e.g. FP16 vs FP32 fallback): add margin to the target.")
    return FallbackPlan(status, nodes, search.target, value, strategy, names, tuple(search.log),
                        search.budget, minimal, message=message)


def write_mixed_model(qmodel: QuantizedModel, plan: FallbackPlan | Iterable[str], path: str | os.PathLike,
                      precision: Precision = Precision.FP16) -> QuantizedModel:
    """Writes the mixed-precision model: the plan's nodes lose their Q/DQ pairs.

    Args:
        qmodel: The fully quantized model and its records.
        plan: A plan (its ``nodes``) or node names.
        path: Destination ``.onnx``; its folder must exist.
        precision: FP16 (what TensorRT runs; ONNX Runtime's CPU provider lacks some FP16 kernels)
            or FP32 (for CPU backends).

    Returns:
        The mixed model with its remaining records.

    Raises:
        ModelError: A node is not quantized in ``qmodel``, or the folder does not exist.
    """
    from quantdbg.qdq import remove_qdq

    nodes = plan.nodes if isinstance(plan, FallbackPlan) else tuple(plan)
    mixed = remove_qdq(qmodel, nodes, Precision(precision))
    mixed.save(path)
    return mixed


# --------------------------------------------------------------------------------------------
# The automatic flow: rank, search, verify on the real mixed-precision model
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class FallbackConfig:
    """How :func:`auto_fallback` ranks and searches.

    Attributes:
        mode: Sensitivity mode that ranks the layers (``"local"`` costs about two FP32 passes;
            ``"isolated"``/``"leave-one-out"`` one pass per layer but rank by the task metric).
        strategy: Search strategy (see :func:`search_fallback`).
        precision: What fallback layers compute in: FP16 (TensorRT) or FP32 (CPU backends).
        max_evaluations: Search budget (None: :func:`default_budget`).
        jobs: Processes for isolated / leave-one-out ranking.

    Raises:
        ConfigError: Unknown mode or strategy, or a budget / jobs below 1.
    """

    mode: Mode = "local"
    strategy: Strategy = "bisect"
    precision: Precision = Precision.FP16
    max_evaluations: int | None = None
    jobs: int = 1

    def __post_init__(self) -> None:
        from quantdbg.sensitivity import MODES

        if self.mode not in MODES:
            raise ConfigError(f"Unknown sensitivity mode {self.mode!r}; choose one of {', '.join(MODES)}.")
        if self.strategy not in _STRATEGIES:
            raise ConfigError(f"Unknown fallback strategy {self.strategy!r}; choose one of "
                              f"{', '.join(_STRATEGIES)}.")
        object.__setattr__(self, "precision", Precision(self.precision))
        if self.max_evaluations is not None and self.max_evaluations < 1:
            raise ConfigError(f"max_evaluations must be >= 1 or None, got {self.max_evaluations}.")
        if self.jobs < 1:
            raise ConfigError(f"jobs must be >= 1, got {self.jobs}.")


@dataclass(frozen=True)
class FallbackResult:
    """What :func:`auto_fallback` produced.

    Attributes:
        plan: The search's plan.
        report: The sensitivity report the search walked.
        mixed: The mixed-precision model (None when the target is unreachable).
    """

    plan: FallbackPlan
    report: SensitivityReport
    mixed: QuantizedModel | None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict of the plan and the report (not the model bytes)."""
        return {"plan": self.plan.to_dict(), "report": self.report.to_dict()}


def auto_fallback(fp_model: ModelSource, qmodel: QuantizedModel, data: DataSource, target: FallbackTarget, *,
                  metric: TaskMetric | MetricName = "sqnr", config: FallbackConfig | None = None,
                  runner_factory: RunnerFactory | None = None, report: SensitivityReport | None = None,
                  progress: bool = False) -> FallbackResult:
    """Ranks the layers, searches the smallest fallback set, and verifies it on the real model.

    Search evaluations feed the switchable graph of :mod:`quantdbg.sensitivity` (one session,
    fallback layers exactly FP32); the verification runs the mixed model written by
    :func:`quantdbg.qdq.remove_qdq` in ``config.precision``. Model-file metrics (commands) get the
    mixed model in ``config.precision`` at every evaluation.

    Args:
        fp_model: The FP32 original (path or ModelProto).
        qmodel: The fully quantized model and its records.
        data: Evaluation data.
        target: What must hold; an ``"sqnr"`` target always reads the output SQNR, the others
            read ``metric``; a relative-loss target without a reference gets the FP32 model's.
        metric: Task metric or output-metric name.
        config: Ranking and search settings.
        runner_factory: Makes the runners (default: ONNX Runtime, CPU).
        report: A sensitivity report to walk instead of computing one (same layers).
        progress: Show progress bars.

    Returns:
        The plan, the report and (unless unreachable) the mixed model.

    Raises:
        ConfigError: Inconsistent target and metric, or a report for other layers.
        ModelError: The models do not match their records.
    """
    from quantdbg.evaluation import as_task_metric
    from quantdbg.sensitivity import VariantEvaluator, analyze_sensitivity

    config = config or FallbackConfig()
    task = as_task_metric("sqnr" if target.kind == "sqnr" else metric)
    if target.kind != "sqnr" and task.higher_is_better == target.lower_is_better:
        direction = "lower" if task.higher_is_better else "higher"
        raise ConfigError(f"The target says {direction} is better but metric {task.name!r} is "
                          f"{'higher' if task.higher_is_better else 'lower'}-is-better; make them agree.")
    if report is None:
        report = analyze_sensitivity(fp_model, qmodel, data, mode=config.mode, metric=task,
                                     runner_factory=runner_factory, jobs=config.jobs, progress=progress)
    elif set(report.ranking) != set(qmodel.layers):
        raise ConfigError("The sensitivity report ranks other layers than the Q/DQ model holds; analyse "
                          "this model (or pass report=None).")
    with VariantEvaluator(fp_model, qmodel, data, task, runner_factory) as evaluator:
        if target.kind == "relative_loss" and target.reference is None:
            target = target.with_reference(evaluator.reference_value())
        layers = evaluator.layers
        if task.needs_model:
            evaluate = lambda nodes: task.evaluate_model(  # noqa: E731
                _mixed(qmodel, nodes, config.precision).model)
        else:
            evaluate = lambda nodes: evaluator.run([n for n in layers if n not in nodes]).value  # noqa: E731
        verify = lambda nodes: evaluator.run_model(  # noqa: E731
            _mixed(qmodel, nodes, config.precision).model).value
        plan = search_fallback(report, evaluate, target, config.strategy,
                               max_evaluations=config.max_evaluations, verify=verify)
    plan = plan.with_precision(config.precision)
    mixed = None if plan.status == "unreachable" else _mixed(qmodel, plan.nodes, config.precision)
    return FallbackResult(plan, report, mixed)


def _mixed(qmodel: QuantizedModel, nodes: Iterable[str], precision: Precision) -> QuantizedModel:
    from quantdbg.qdq import remove_qdq

    nodes = tuple(nodes)
    return remove_qdq(qmodel, nodes, precision) if nodes else qmodel
