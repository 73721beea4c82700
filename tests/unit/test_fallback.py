"""Fallback search on synthetic evaluate functions with a known minimal set, targets, plans, mixed models."""
from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import models_sensitivity as ms
import numpy as np
import onnx
import pytest

from quantdbg.backends import OnnxrtRunnerFactory, OrtConfig
from quantdbg.backends.tensorrt import EngineBuildSpec, TrtConfig, build_commands
from quantdbg.backends.tensorrt.commands import trtexec_command
from quantdbg.config import Precision
from quantdbg.errors import ConfigError, FormatError
from quantdbg.fallback import (
    FallbackConfig,
    FallbackPlan,
    FallbackResult,
    FallbackTarget,
    auto_fallback,
    search_fallback,
    write_mixed_model,
)
from quantdbg.fallback.budget import default_budget
from quantdbg.fallback.plan import TensorRTSettings
from quantdbg.sensitivity import SensitivityConfig, VariantEvaluator

ONE_THREAD = OnnxrtRunnerFactory(OrtConfig(intra_op_num_threads=1))


class Additive:
    """value(S) = 1 - sum of the costs of the nodes NOT in S (S: the nodes kept out of INT8): monotone, with a
    unique minimal set."""

    def __init__(self, names: list[str], critical: set[str], big: float = 0.1, small: float = 1e-4) -> None:
        self.cost = {n: big if n in critical else small for n in names}
        self.calls: list[frozenset[str]] = []

    def value(self, exclude: frozenset[str]) -> float:
        return 1.0 - sum(c for n, c in self.cost.items() if n not in exclude)

    def __call__(self, exclude: frozenset[str]) -> float:
        self.calls.append(exclude)
        return self.value(exclude)


TARGET = FallbackTarget.min_metric(0.99)  # tolerates every small cost, no big one


def _problem(rng: np.random.Generator, n_layers: int, n_critical: int, within: int):
    names = [f"node{i}" for i in range(n_layers)]
    ranking = list(rng.permutation(names))
    critical = set(rng.choice(ranking[:within], n_critical, replace=False))
    return ranking, critical


@pytest.mark.parametrize("seed", range(12))
def test_bisect_finds_the_minimal_set_within_budget(seed):
    rng = np.random.default_rng(seed)
    n_layers = int(rng.choice([16, 48, 100]))
    ranking, critical = _problem(rng, n_layers, int(rng.integers(1, 4)), within=4)
    evaluate = Additive(ranking, critical)
    plan = search_fallback(ranking, evaluate, TARGET, strategy="bisect")
    assert plan.status == "met"
    assert TARGET.is_met(evaluate.value(frozenset(plan.exclude)))
    for node in plan.exclude:  # greedy-minimal: dropping any single node breaks the target
        assert not TARGET.is_met(evaluate.value(frozenset(plan.exclude) - {node}))
    assert set(plan.exclude) == critical  # additive costs: the minimal set is unique
    assert plan.minimal
    assert plan.n_evaluations <= default_budget(n_layers) == math.floor(2 * math.log2(n_layers) + 2)
    assert [e.purpose for e in plan.evaluations][-1] == "verify"
    assert list(plan.exclude) == [n for n in ranking if n in critical]  # reported in rank order


def test_no_set_is_evaluated_twice_or_when_implied():
    ranking = [f"n{i}" for i in range(48)]
    evaluate = Additive(ranking, {"n0", "n2", "n5", "n6"})
    plan = search_fallback(ranking, evaluate, TARGET, verify=lambda exclude: 1.0)
    calls = evaluate.calls
    assert len(calls) == len(set(calls)) == plan.n_evaluations
    for i, later in enumerate(calls):  # monotonicity already decides these: never evaluated
        earlier = calls[:i]
        assert not any(later <= s for s in earlier if not TARGET.is_met(evaluate.value(s)))
        assert not any(s <= later for s in earlier if TARGET.is_met(evaluate.value(s)))


def test_budget_exhausted_during_pruning_keeps_a_passing_set():
    ranking = [f"n{i}" for i in range(16)]
    critical = {"n0", "n3", "n9"}  # n9 sits deep: the passing prefix holds 10 nodes, too many to prune
    evaluate = Additive(ranking, critical)
    plan = search_fallback(ranking, evaluate, TARGET, strategy="bisect")
    assert plan.status == "met"
    assert critical <= set(plan.exclude)
    assert plan.n_evaluations == default_budget(16)
    assert not plan.minimal


def test_linear_strategy_is_the_top_k_baseline():
    ranking = [f"n{i}" for i in range(10)]
    evaluate = Additive(ranking, {"n0", "n2"})
    plan = search_fallback(ranking, evaluate, TARGET, strategy="linear", max_evaluations=20)
    assert plan.exclude == ("n0", "n1", "n2")
    assert [len(e.exclude) for e in plan.evaluations if e.purpose == "search"] == [1, 2, 3]


def test_already_met_gives_an_empty_set():
    ranking = ["a", "b", "c"]
    plan = search_fallback(ranking, lambda exclude: 1.0, TARGET)
    assert plan.status == "met" and plan.exclude == ()


def test_unreachable_target_reports_the_best_achieved():
    ranking = [f"n{i}" for i in range(8)]
    plan = search_fallback(ranking, lambda exclude: 0.5 + 0.01 * len(exclude), TARGET)
    assert plan.status == "unreachable"
    assert plan.value == pytest.approx(0.58) and plan.exclude == tuple(ranking)
    assert plan.message == ("Target metric >= 0.99 is unreachable: even all 8 ranked nodes out of INT8 miss "
                            "it; best achieved 0.58 with 8 node(s) out of INT8.")


def test_verification_failure_is_reported():
    ranking = ["a", "b"]
    plan = search_fallback(ranking, lambda exclude: 1.0 if "a" in exclude else 0.0, TARGET,
                           verify=lambda exclude: 0.9)
    assert plan.status == "verification_failed" and plan.exclude == ("a",) and plan.value == 0.9


def test_targets():
    assert FallbackTarget.min_metric(0.5).is_met(0.5)
    assert FallbackTarget.min_metric(0.5, lower_is_better=True).is_met(0.4)
    assert not FallbackTarget.min_metric(0.5).is_met(math.nan)
    loss = FallbackTarget.max_relative_loss(1.0, reference=0.8)
    assert loss.is_met(0.793) and not loss.is_met(0.791)
    assert FallbackTarget.max_relative_loss(10.0, reference=2.0, lower_is_better=True).is_met(2.19)
    assert FallbackTarget.min_sqnr(20).is_met(25.0)
    with pytest.raises(ConfigError, match=r"^An SQNR target is always higher-is-better"):
        FallbackTarget("sqnr", 20.0, lower_is_better=True)
    with pytest.raises(ConfigError, match=r"^A relative-loss bound is a percentage >= 0, got -1\.0\.$"):
        FallbackTarget.max_relative_loss(-1.0)
    with pytest.raises(ConfigError, match=r"needs the FP32 reference metric"):
        search_fallback(["a"], lambda exclude: 1.0, FallbackTarget.max_relative_loss(1.0))


def test_bad_rankings():
    with pytest.raises(ConfigError, match=r"^The ranking is empty"):
        search_fallback([], lambda exclude: 1.0, TARGET)
    with pytest.raises(ConfigError, match=r"^The ranking lists node 'a' twice"):
        search_fallback(["a", "b", "a"], lambda exclude: 1.0, TARGET)
    with pytest.raises(ConfigError, match=r"^Unknown fallback strategy 'greedy'; choose one of auto, bisect, "
                                          r"linear\.$"):
        search_fallback(["a"], lambda exclude: 1.0, TARGET, strategy="greedy")  # type: ignore[arg-type]


def test_plan_json_round_trip_and_interop_settings():
    ranking = [f"n{i}" for i in range(6)]
    target = FallbackTarget.max_relative_loss(2.0, reference=1.0)
    plan = search_fallback(ranking, Additive(ranking, {"n1"}), target)
    data = json.loads(json.dumps(plan.to_dict(), allow_nan=False))
    assert FallbackPlan.from_dict(data) == plan
    assert data["format"] == "quantdbg.fallback_plan/2" and "nodes" not in data
    assert data["exclude"] == ["n1"] and data["modelopt"]["nodes_to_exclude"] == ["n1"]
    assert all(set(e) == {"exclude", "value", "met", "purpose", "round"} for e in data["evaluations"])
    bisect = search_fallback(ranking, Additive(ranking, {"n1"}), target, strategy="bisect").to_dict()
    assert all(set(e) == {"exclude", "value", "met", "purpose"} for e in bisect["evaluations"])
    assert [e["exclude"] for e in data["evaluations"]] == [list(e.exclude) for e in plan.evaluations]
    assert data["tensorrt"]["trtexec"] == "trtexec --onnx=MIXED.onnx --stronglyTyped"
    assert data["tensorrt"]["layer_precisions"] == {"n1": "fp16"}
    assert "--precisionConstraints=obey --layerPrecisions=n1:fp16" in data["tensorrt"]["trtexec_weakly_typed"]
    assert FallbackPlan.from_dict({**data, "format": "quantdbg.fallback_plan/2"}) == plan
    with pytest.raises(FormatError, match=r"^<data>: not a valid quantdbg\.fallback_plan/2 document: "
                                          r"format is 'other', expected 'quantdbg\.fallback_plan/2'\."):
        FallbackPlan.from_dict({"format": "other"})
    with pytest.raises(FormatError, match=r"document: field 'budget' is missing\. Re-create it"):
        FallbackPlan.from_dict({k: v for k, v in data.items() if k != "budget"})
    with pytest.raises(FormatError, match=r"field 'target\.threshold': expected a number or "):
        FallbackPlan.from_dict({**data, "target": {**data["target"], "threshold": "x"}})


def test_a_version_1_plan_is_refused_with_the_fix(tmp_path):
    plan = search_fallback(["a", "b"], lambda exclude: float(len(exclude)), FallbackTarget.min_metric(1.0))
    old = {**plan.to_dict(), "format": "quantdbg.fallback_plan/1"}
    (tmp_path / "old.json").write_text(json.dumps(old))
    with pytest.raises(FormatError, match=r"not a valid quantdbg\.fallback_plan/2 document: format is "
                                          r"'quantdbg\.fallback_plan/1', expected "
                                          r"'quantdbg\.fallback_plan/2'\. Re-create it with the quantdbg "
                                          r"command that wrote it\.$"):
        FallbackPlan.read(tmp_path / "old.json")
    assert not hasattr(plan, "nodes") and not hasattr(plan, "nodes_to_exclude")  # one name: exclude


def test_plan_build_is_read_back_from_its_tensorrt_section(tmp_path):
    plan = search_fallback(["a", "b"], lambda exclude: float(len(exclude)), FallbackTarget.min_metric(1.0))
    built = replace(plan, build=EngineBuildSpec(Path("m.onnx"), TrtConfig(save_engine=Path("m.engine")),
                                                exclude=plan.exclude))
    data = built.to_dict()
    assert "build" not in data and data["tensorrt"]["build"] == {
        "spec": built.build.to_dict(), "commands": build_commands(built.build).to_dict()}
    assert FallbackPlan.read(built.write(tmp_path / "plan.json")) == built


@pytest.mark.parametrize("precision", [Precision.FP16, Precision.FP32])
def test_plan_trtexec_commands_come_from_the_tensorrt_backend(precision):
    plan = search_fallback(["a", "b/c", "d"], lambda exclude: float(len(exclude)),
                           FallbackTarget.min_metric(2.0))
    plan = plan.with_precision(precision)
    spec = EngineBuildSpec(Path("MIXED.onnx"), exclude=plan.exclude, exclude_precision=precision)
    section = plan.to_dict()["tensorrt"]
    assert section["trtexec"] == trtexec_command(spec) == "trtexec --onnx=MIXED.onnx --stronglyTyped"
    assert section["trtexec_weakly_typed"] == trtexec_command(spec, strongly_typed=False)
    assert section["builder_flags"] == ["int8", precision.value]
    assert section["layer_precisions"] == {node: precision.value for node in plan.exclude}
    assert plan.tensorrt.trtexec_args("x.onnx") == ["trtexec", "--onnx=x.onnx", "--stronglyTyped"]
    assert TensorRTSettings.from_dict(json.loads(json.dumps(section))) == plan.tensorrt


def test_weakly_typed_trtexec_command_pins_the_excluded_nodes():
    spec = EngineBuildSpec(Path("m.onnx"), exclude=("a/b", "c.d", "e f"), exclude_precision="fp16")
    assert trtexec_command(spec, strongly_typed=False) == (
        "trtexec --onnx=m.onnx --int8 --fp16 --precisionConstraints=obey "
        "'--layerPrecisions=a/b:fp16,c.d:fp16,e f:fp16'")
    bare = EngineBuildSpec(Path("m.onnx"), TrtConfig(save_engine=Path("m.engine")), exclude_precision="fp32")
    assert trtexec_command(bare, strongly_typed=False) == \
        "trtexec --onnx=m.onnx --int8 --saveEngine=m.engine"  # FP32 needs no flag (trtexec has none)


def test_fallback_config_json_round_trip_and_validation():
    for config in (FallbackConfig(), FallbackConfig(SensitivityConfig(mode="isolated", jobs=2, progress=True),
                                                    "linear", Precision.FP32, 7)):
        assert FallbackConfig.from_dict(json.loads(json.dumps(config.to_dict()))) == config
    with pytest.raises(ConfigError, match=r"^Unknown fallback strategy 'greedy'; choose one of auto, bisect, "
                                          r"linear\.$"):
        FallbackConfig(strategy="greedy")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"^max_evaluations must be >= 1 or None, got 0\.$"):
        FallbackConfig(max_evaluations=0)
    with pytest.raises(FormatError, match=r"field 'sensitivity\.mode': expected one of"):
        FallbackConfig.from_dict({"sensitivity": {"mode": "global"}})


def test_target_json_round_trip():
    for target in (TARGET, FallbackTarget.max_relative_loss(1.5, 0.8, True), FallbackTarget.min_sqnr(30)):
        assert FallbackTarget.from_dict(json.loads(json.dumps(target.to_dict()))) == target


def _fed_by(model: onnx.ModelProto, node_name: str) -> list[str]:
    producers = {out: n.op_type for n in model.graph.node for out in n.output}
    node = next(n for n in model.graph.node if n.name == node_name)
    return [producers.get(t, "initializer") for t in node.input]


@pytest.mark.parametrize("precision", [Precision.FP16, Precision.FP32])
def test_mixed_model_drops_exactly_the_excluded_nodes(tmp_path, rng, precision):
    model = ms.mlp4()
    qmodel = ms.quantize_by_hand(model, ms.feeds_for(model, rng))
    mixed = write_mixed_model(qmodel, ["fc1", "fc3"], tmp_path / "mixed.onnx", precision)
    saved = onnx.load(str(tmp_path / "mixed.onnx"))
    for node in ("fc1", "fc3"):
        assert "DequantizeLinear" not in _fed_by(saved, node)
        if precision is Precision.FP16:
            assert set(_fed_by(saved, node)) <= {"Cast", "initializer"}
    for node in ("fc0", "fc2"):
        assert _fed_by(saved, node) == ["DequantizeLinear", "DequantizeLinear"]
    assert mixed.layers == ("fc0", "fc2")
    assert mixed.excluded == ("fc1", "fc3") and mixed.excluded_precision is precision


def test_auto_fallback_on_a_planted_bad_layer(rng):
    model = ms.mlp4()
    feeds = ms.feeds_for(model, rng)
    qmodel = ms.quantize_by_hand(model, feeds, {"act1": 0.01})
    with VariantEvaluator(model, qmodel, feeds, "cosine", ONE_THREAD) as evaluator:
        result = auto_fallback(evaluator, FallbackTarget.min_sqnr(30.0))  # reads the SQNR, not the cosine
        with pytest.raises(ConfigError, match=r"^The target says lower is better but metric 'cosine' is "
                                              r"higher-is-better; make them agree\.$"):
            auto_fallback(evaluator, FallbackTarget.min_metric(0.9, lower_is_better=True))
        with pytest.raises(ConfigError, match=r"^The sensitivity report ranks other layers"):
            other = replace(result.report, layers=result.report.layers[1:], output_space=None)
            auto_fallback(evaluator, TARGET, report=other)
    assert result.plan.status == "met" and result.plan.exclude == ("fc2",)
    assert result.plan.evaluations[-1].value >= 30.0
    assert result.report.ranking[0] == "fc2"
    assert result.mixed is not None and result.mixed.layers == ("fc0", "fc1", "fc3")
    data = json.loads(json.dumps(result.to_dict(), allow_nan=False))
    assert data["plan"]["format"] == "quantdbg.fallback_plan/2"
    assert data["report"]["format"] == "quantdbg.sensitivity/1"
    assert FallbackResult.from_dict(data) == replace(result, mixed=None)
