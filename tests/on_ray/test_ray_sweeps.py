"""Sensitivity sweeps and fallback search rounds as Ray tasks: the same reports and plans as serially,
a resumed sweep runs only what is missing, and a killed worker costs only its task."""
from __future__ import annotations

import dataclasses
import json
import os
import signal
import sys

import models_sensitivity as ms
import numpy as np
import pytest

ray = pytest.importorskip("ray")

from quantdbg.backends import OnnxrtRunnerFactory, OrtConfig  # noqa: E402
from quantdbg.config import Precision  # noqa: E402
from quantdbg.evaluation import OutputFunction  # noqa: E402
from quantdbg.execution import RayExecutor  # noqa: E402
from quantdbg.fallback import FallbackConfig, FallbackTarget, auto_fallback  # noqa: E402
from quantdbg.sensitivity import (  # noqa: E402
    SensitivityConfig,
    VariantEvaluator,
    analyze_sensitivity,
)
from quantdbg.sensitivity.sweep import BASELINE  # noqa: E402

# Workers import this module's functions by value: they need not find the tests folder.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

ONE_THREAD = OnnxrtRunnerFactory(OrtConfig(intra_op_num_threads=1))


class CountingExecutor(RayExecutor):
    """A RayExecutor that notes every map it is given (on the driver)."""

    def __init__(self) -> None:
        super().__init__()
        self.maps: list[tuple[str, int]] = []

    def map(self, fn, items, **options):
        self.maps.append((options.get("desc", ""), len(items)))
        return super().map(fn, items, **options)


@pytest.fixture(scope="module")
def planted():
    """small_cnn, its feeds, and a Q/DQ model whose conv2 input range is 100x too small."""
    model = ms.small_cnn()
    feeds = ms.feeds_for(model, np.random.default_rng(0))
    return model, feeds, ms.quantize_by_hand(model, feeds, {"r1": 0.01})


def _analyze(planted, executor=None, metric="sqnr", **settings):
    model, feeds, qmodel = planted
    config = SensitivityConfig(evidence=False, executor=executor, **settings)
    report = analyze_sensitivity(model, qmodel, feeds, config, metric=metric, runner_factory=ONE_THREAD)
    return dataclasses.replace(report, seconds=0.0, footprint=None)  # this run's wall time and memory


@pytest.mark.parametrize("mode", ["isolated", "leave-one-out"])
def test_sweep_on_ray_gives_the_serial_report(ray_instance, planted, mode):
    serial = _analyze(planted, mode=mode)
    executor = CountingExecutor()
    spread = _analyze(planted, executor, mode=mode)
    assert executor.maps == [(f"sensitivity ({mode})", 5)]  # the baseline and the 4 layers, as tasks
    assert spread == serial
    assert spread.to_dict() == serial.to_dict()
    assert serial.ranking[0] == "conv2"  # the planted layer


@pytest.mark.parametrize("mode", ["local", "cumulative"])
def test_output_space_variants_on_ray_give_the_serial_report(ray_instance, planted, mode):
    serial = _analyze(planted, mode=mode)
    executor = CountingExecutor()
    spread = _analyze(planted, executor, mode=mode)
    assert executor.maps == [("sensitivity (output space)", 4)]  # each layer alone, as a task
    assert spread == serial and serial.output_space is not None


def test_resumed_sweep_runs_only_the_missing_variants(ray_instance, planted, tmp_path):
    path = tmp_path / "sweep.json"
    serial = _analyze(planted, mode="isolated", results_path=path)
    lines = path.read_text().splitlines(keepends=True)
    assert [json.loads(line)["key"] for line in lines[1:3]] == [f"evaluation:sweep:isolated:{name}"
                                                               for name in (BASELINE, "conv1")]
    path.write_text("".join(lines[:3]))  # what a sweep stopped after the baseline and conv1 leaves behind
    executor = CountingExecutor()
    resumed = _analyze(planted, executor, mode="isolated", results_path=path)
    assert executor.maps == [("sensitivity (isolated)", 3)]  # conv2, conv3, fc: not what was recorded
    assert resumed.n_passes == serial.n_passes - 2
    assert dataclasses.replace(resumed, n_passes=serial.n_passes) == serial


def _mean_abs(outputs, reference):
    return float(np.mean(np.abs(outputs["y"] - reference["y"])))


class KillOnce:
    """``_mean_abs``, except that the first worker to score kills its own process (SIGKILL)."""

    def __init__(self, marker: str) -> None:
        self.marker = marker
        self.driver = os.getpid()

    def __call__(self, outputs, reference):
        if os.getpid() != self.driver and not os.path.exists(self.marker):
            with open(self.marker, "w"):
                pass
            os.kill(os.getpid(), signal.SIGKILL)
        return _mean_abs(outputs, reference)


def test_a_killed_worker_costs_only_its_task(ray_instance, planted, tmp_path):
    marker = tmp_path / "killed"
    serial = _analyze(planted, metric=OutputFunction(_mean_abs, "mean_abs", False), mode="leave-one-out")
    killing = OutputFunction(KillOnce(str(marker)), "mean_abs", False)
    spread = _analyze(planted, RayExecutor(max_retries=2), metric=killing, mode="leave-one-out")
    assert marker.exists()  # a worker did die mid-sweep
    assert spread == serial


def test_fallback_search_rounds_on_ray_give_the_serial_plan(ray_instance, planted):
    model, feeds, qmodel = planted

    def search(executor):
        config = FallbackConfig(SensitivityConfig(mode="isolated", evidence=False, executor=executor),
                                precision=Precision.FP32, gallop_share=1.0, executor=executor)
        with VariantEvaluator(model, qmodel, feeds, "sqnr", ONE_THREAD) as evaluator:
            return auto_fallback(evaluator, FallbackTarget.min_sqnr(40.0), config)

    serial = search(None)
    executor = CountingExecutor()
    spread = search(executor)
    assert ("fallback search round", 3) in executor.maps  # the gallop's prefixes 1, 2, 4 at once
    assert spread.plan == serial.plan
    assert spread.plan.exclude == serial.plan.exclude and serial.plan.status == "met"
    assert spread.mixed.model.SerializeToString() == serial.mixed.model.SerializeToString()
