"""Weight pairs of a model kept in its data file are left to ONNX Runtime in the sensitivity graphs:
no fake-quantized copy in the graph, and every value equals the NumPy-folded in-memory graph's."""
from __future__ import annotations

import models_large
import numpy as np
import onnx
import onnxruntime as ort
import pytest

from quantdbg import quantize
from quantdbg.backends import OnnxrtRunnerFactory, OrtConfig
from quantdbg.model import load_model
from quantdbg.model.external import all_tensors, inline_bytes
from quantdbg.model.staging import StagedModel, staged
from quantdbg.sensitivity import VariantEvaluator
from quantdbg.sensitivity.graphs import LocalVariant, local_graph
from quantdbg.sensitivity.reductions import DataPass, run_local_graph
from quantdbg.variants.switch import switch_graph

WIDTH = 32


@pytest.fixture(scope="module")
def forms(tmp_path_factory):
    folder = tmp_path_factory.mktemp("lazy")
    path = models_large.matmul_stack(folder, 3 * WIDTH * WIDTH * 4, WIDTH)  # 3 layers, weights on disk
    np.savez(folder / "calib.npz", x=models_large.inputs(WIDTH, 16))
    np.savez(folder / "eval.npz", x=models_large.inputs(WIDTH, 8, seed=2))
    inline = onnx.load(str(path))  # the same model, every weight in memory
    return (path, quantize(path, folder / "calib.npz"), inline, quantize(inline, folder / "calib.npz"),
            folder / "eval.npz")


def _evaluators(forms, level):
    path, q_ext, inline, q_mem, evals = forms
    factory = OnnxrtRunnerFactory(OrtConfig(graph_optimization_level=level))
    return (VariantEvaluator(path, q_ext, evals, runner_factory=factory),
            VariantEvaluator(inline, q_mem, evals, runner_factory=factory))


def test_graphs_of_a_lazy_model_hold_no_fake_quantized_weight(forms):
    path, q_ext, inline, q_mem, _ = forms
    lazy_fp = load_model(path)
    variants = [LocalVariant(layer, "recorded", {}) for layer in q_ext.layers]
    pairs = ((switch_graph(q_ext, lazy_fp).model, switch_graph(q_mem, inline).model),
             (local_graph(lazy_fp, q_ext, variants).model, local_graph(inline, q_mem, variants).model))
    for lazy, folded in pairs:
        weights = len(q_ext.layers) * WIDTH * WIDTH * 4
        assert inline_bytes(lazy) < WIDTH * 64  # scales and zero points only
        assert inline_bytes(folded) >= weights  # the in-memory form folds each weight in NumPy
        assert not [i.name for i in lazy.graph.initializer if i.name.endswith("/fake_quantized")]


@pytest.mark.parametrize("level", ["all", "disable"])  # folded by ONNX Runtime, or computed at each run
def test_switch_graph_outputs_of_a_lazy_model_equal_the_numpy_folded_ones(forms, level):
    lazy, folded = _evaluators(forms, level)
    with lazy, folded:
        layers = lazy.layers
        for quantized in ((), layers[:1], layers[1:2], layers):
            for got, want in zip(lazy.outputs(quantized), folded.outputs(quantized), strict=True):
                for name in want:
                    np.testing.assert_array_equal(got[name], want[name])


@pytest.mark.parametrize("level", ["all", "disable"])
def test_local_errors_of_a_lazy_model_equal_the_numpy_folded_ones(forms, level):
    lazy, folded = _evaluators(forms, level)
    variants = [LocalVariant(layer, "recorded", {}) for layer in lazy.layers]
    variants += [LocalVariant(lazy.layers[1], "wide", {0: 50.0})]  # a second clone shares the weight pair
    run = DataPass("local")
    assert run_local_graph(lazy, variants, run) == run_local_graph(folded, variants, run)


def _session_constants(model: onnx.ModelProto, tmp_path) -> list[tuple[int, tuple[int, ...]]]:
    """(element type, shape) of every constant ONNX Runtime keeps of ``model`` after optimizing it
    (as quantdbg's runner sets it up), subgraphs included."""
    options = ort.SessionOptions()
    options.add_session_config_entry("session.disable_quant_qdq", "1")
    options.log_severity_level = 3
    options.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    with staged(model) as stage:
        ort.InferenceSession(stage.source, stage.configure(options), providers=["CPUExecutionProvider"])
    optimized = onnx.load(str(tmp_path / "optimized.onnx"))
    return [(t.data_type, tuple(t.dims)) for t in all_tensors(optimized)]


def test_a_lazy_switch_graph_session_holds_each_weight_once_in_fp32_and_once_in_int8(forms, tmp_path):
    path, q_ext, *_ = forms
    kept = _session_constants(switch_graph(q_ext, load_model(path)).model, tmp_path)
    weights = [dtype for dtype, shape in kept if shape == (WIDTH, WIDTH)]
    assert sorted(weights) == sorted([onnx.TensorProto.FLOAT, onnx.TensorProto.INT8] * len(q_ext.layers))


def test_sessions_of_large_models_run_without_arena_in_priority_order():
    large = StagedModel(b"", large=True).configure(ort.SessionOptions())
    small = StagedModel(b"").configure(ort.SessionOptions())
    assert not large.enable_cpu_mem_arena and large.execution_order == ort.ExecutionOrder.PRIORITY_BASED
    assert small.enable_cpu_mem_arena and small.execution_order == ort.ExecutionOrder.DEFAULT
