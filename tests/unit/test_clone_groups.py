"""The local graph's clones split across sessions: groups under a byte budget, the same errors as one
session, one pass counted, and no session holding more than its group's quantized weights."""
from __future__ import annotations

import models_large
import numpy as np
import onnx
import pytest

from quantdbg import quantize
from quantdbg.backends import OnnxrtRunnerFactory, Runner, RunnerFactory
from quantdbg.model import load_model
from quantdbg.sensitivity import VariantEvaluator
from quantdbg.sensitivity import clone_groups as groups_module
from quantdbg.sensitivity.clone_groups import clone_groups, layer_weight_bytes
from quantdbg.sensitivity.graphs import LOCAL_SUFFIX, LocalVariant
from quantdbg.sensitivity.reductions import DataPass, run_local_graph

WIDTH = 32
LAYER_BYTES = WIDTH * WIDTH * 4


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    folder = tmp_path_factory.mktemp("groups")
    path = models_large.matmul_stack(folder, 3 * LAYER_BYTES, WIDTH)  # 3 layers, weights on disk
    np.savez(folder / "calib.npz", x=models_large.inputs(WIDTH, 16))
    np.savez(folder / "eval.npz", x=models_large.inputs(WIDTH, 24, seed=2))
    inline = onnx.load(str(path))  # the same model, every weight in memory
    return {"lazy": (path, quantize(path, folder / "calib.npz")),
            "inline": (inline, quantize(inline, folder / "calib.npz")), "eval": folder / "eval.npz"}


def _variants(layers):
    return [LocalVariant(layers[0], "recorded", {}), LocalVariant(layers[0], "wide", {0: 50.0}),
            LocalVariant(layers[1], "recorded", {}), LocalVariant(layers[2], "recorded", {}),
            LocalVariant(layers[2], "wide", {0: 50.0})]


def test_groups_are_consecutive_runs_of_layers_under_the_budget(stack):
    path, qmodel = stack["lazy"]
    fp = load_model(path)
    assert layer_weight_bytes(fp, qmodel, qmodel.layers) == dict.fromkeys(qmodel.layers, LAYER_BYTES)
    variants = _variants(qmodel.layers)
    assert clone_groups(fp, qmodel, variants, 2 * LAYER_BYTES) == [[0, 1, 2], [3, 4]]
    assert clone_groups(fp, qmodel, variants, LAYER_BYTES) == [[0, 1], [2], [3, 4]]
    assert clone_groups(fp, qmodel, variants, 0) == [[0, 1], [2], [3, 4]]  # a layer over it: alone
    assert clone_groups(fp, qmodel, variants) == [[0, 1, 2, 3, 4]]  # a small model: one session


class _Recording(RunnerFactory):
    """ONNX Runtime runners; remembers every model a session was made for."""

    def __init__(self) -> None:
        self.models: list[onnx.ModelProto] = []

    def __call__(self, model: onnx.ModelProto) -> Runner:
        self.models.append(model)
        return OnnxrtRunnerFactory()(model)


def _cloned_layers(model: onnx.ModelProto) -> set[str]:
    return {n.name.removesuffix(LOCAL_SUFFIX) for n in model.graph.node if n.name.endswith(LOCAL_SUFFIX)}


@pytest.mark.parametrize("form", ["lazy", "inline"])
def test_split_sessions_give_the_errors_of_one_session_and_count_one_pass(stack, form, monkeypatch):
    model, qmodel = stack[form]
    variants = _variants(qmodel.layers)
    run = DataPass("local", max_batches=None)
    one = VariantEvaluator(model, qmodel, stack["eval"])
    whole = run_local_graph(one, variants, run)
    monkeypatch.setattr(groups_module, "GROUP_FLOOR", 0)
    monkeypatch.setattr(groups_module, "GROUP_SHARE", 3)  # a third of the weights: one layer per session
    factory = _Recording()
    split = VariantEvaluator(model, qmodel, stack["eval"], runner_factory=factory)
    assert run_local_graph(split, variants, run) == whole
    assert split.n_passes == one.n_passes == 1
    assert [_cloned_layers(m) for m in factory.models] == [{layer} for layer in qmodel.layers]
