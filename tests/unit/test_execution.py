"""The execution seam without Ray: LocalExecutor, shard bounds, what travels to workers, --ray parsing."""
from __future__ import annotations

import argparse
import os
import pickle
from types import MappingProxyType

import numpy as np
import pytest

from quantdbg import _optional
from quantdbg.cli._options import add_execution_options, executor
from quantdbg.config import CalibConfig
from quantdbg.data import ArrayData, FeedList, shard_bounds
from quantdbg.errors import ConfigError, DataError, MissingDependencyError
from quantdbg.execution import Executor, LocalExecutor, RayExecutor
from quantdbg.fallback import FallbackConfig, SearchConfig
from quantdbg.sensitivity import SensitivityConfig
from quantdbg.variants.evaluator import _TRAVELS, VariantEvaluator


def _tagged(shared, item):
    return (shared["tag"], item * item, os.getpid())


@pytest.mark.parametrize("jobs", [1, 2])
def test_local_executor_returns_results_in_input_order(jobs):
    seen = []
    found = LocalExecutor(jobs).map(_tagged, [3, 1, 2, 5], shared={"tag": "t"},
                                    on_result=lambda i, r: seen.append(i))
    assert [(tag, sq) for tag, sq, _ in found] == [("t", 9), ("t", 1), ("t", 4), ("t", 25)]
    assert sorted(seen) == [0, 1, 2, 3]
    assert ({pid for *_, pid in found} == {os.getpid()}) == (jobs == 1)  # forked workers otherwise


def test_executors_follow_the_protocol_and_are_checked():
    assert isinstance(LocalExecutor(), Executor) and isinstance(RayExecutor(), Executor)
    with pytest.raises(ConfigError, match=r"^LocalExecutor jobs must be an integer >= 1, got 0\.$"):
        LocalExecutor(0)
    with pytest.raises(ConfigError, match=r"^max_retries must be >= 0, got -1\.$"):
        RayExecutor(max_retries=-1)
    with pytest.raises(ConfigError, match=r"^shards must be an integer >= 1 or None \(one per worker\), "
                                          r"got 0\.$"):
        CalibConfig(shards=0)


def test_ray_is_named_as_the_extra_to_install(monkeypatch):
    monkeypatch.setattr(_optional, "load", lambda module, extra: (_ for _ in ()).throw(
        MissingDependencyError(f"{module!r} is required here; install `quantdbg[{extra}]`")))
    with pytest.raises(MissingDependencyError, match=r"install `quantdbg\[ray\]`"):
        RayExecutor().connect()


@pytest.mark.parametrize(("n", "count", "expected"), [
    (11, 1, [(0, 11)]), (11, 2, [(0, 6), (6, 11)]), (11, 3, [(0, 4), (4, 8), (8, 11)]),
    (2, 5, [(0, 1), (1, 2)])])
def test_shard_bounds_cover_every_feed_once(n, count, expected):
    assert [shard_bounds(n, i, count) for i in range(min(n, count))] == expected


def test_shards_of_arrays_and_feed_lists_are_the_same_feeds_in_order():
    x = np.arange(21, dtype=np.float32).reshape(21, 1)
    for data in (ArrayData({"x": x}, 4), FeedList(ArrayData({"x": x}, 4)), ArrayData({"x": x}, 4, limit=17)):
        whole = [feed["x"] for feed in data]
        parts = [feed["x"] for i in range(3) for feed in data.shard(i, 3)]
        assert len(parts) == len(whole)
        assert all(np.array_equal(a, b) for a, b in zip(parts, whole, strict=True))
    with pytest.raises(DataError, match=r"^Shard 3 does not exist: the data is cut into 3 shard\(s\)\.$"):
        shard_bounds(6, 3, 3)


def test_executors_stay_out_of_json_and_equality():
    run = LocalExecutor(2)
    for config in (CalibConfig(executor=run, shards=3), SensitivityConfig(executor=run),
                   SearchConfig(executor=run), FallbackConfig(executor=run)):
        assert "executor" not in config.to_dict() and "shards" not in config.to_dict()
        assert type(config).from_dict(config.to_dict()) == config
        assert type(config).from_dict(config.to_dict()).executor is None


def test_read_only_mappings_cross_processes():
    proxy = MappingProxyType({"a": 1})
    back = pickle.loads(pickle.dumps(proxy))
    assert isinstance(back, MappingProxyType) and dict(back) == {"a": 1}


def test_an_evaluator_travels_whole_but_without_its_session():
    import models_sensitivity as ms

    model = ms.mlp4()
    feeds = ms.feeds_for(model, np.random.default_rng(0))
    with VariantEvaluator(model, ms.quantize_by_hand(model, feeds), feeds) as evaluator:
        first = evaluator.run(evaluator.layers[:1])
        assert set(vars(evaluator)) == set(_TRAVELS)  # nothing it holds is left behind
        copy = pickle.loads(pickle.dumps(evaluator))
        assert type(copy) is VariantEvaluator and copy._runner is None and evaluator._runner is not None
        assert copy.run(evaluator.layers[:1]) == first


def _parse(*argv):
    parser = argparse.ArgumentParser()
    add_execution_options(parser)
    return parser.parse_args(argv)


def test_ray_option_chooses_the_cluster():
    assert executor(_parse()) is None
    assert executor(_parse("--ray")).address is None
    assert executor(_parse("--ray", "auto")).address == "auto"
    assert executor(_parse("--ray", "head-node:6379", "--shards", "4")).address == "head-node:6379"
    with pytest.raises(ConfigError, match=r"^--shards splits the calibration over --ray workers; "
                                          r"add --ray\.$"):
        executor(_parse("--shards", "2"))
    with pytest.raises(ConfigError, match=r"^--ray 'model\.onnx' is not a cluster address: give 'auto' or "
                                          r"HOST:PORT"):
        executor(_parse("--ray", "model.onnx"))
