"""The lint's read-only graph view: producers, consumers, Q/DQ pairs, constant parameters, channels."""
from __future__ import annotations

import weakref

import models_large
import models_lint
import numpy as np
import onnx
import pytest
from onnx import helper

from quantdbg import lint, quantize
from quantdbg.diagnostics import qdq_graph
from quantdbg.diagnostics.qdq_graph import (
    QdqGraph,
    channel_counts,
    output_channel_axis,
    pair_name,
    preview,
)
from quantdbg.model import load_model
from quantdbg.model.external import is_external


def test_pairs_qparams_and_weights_of_a_quantized_conv():
    model = models_lint.quantized_conv("g", zero_point=5, c_out=12)
    graph = QdqGraph(model)
    pairs = [(dq.name, q.name if q is not None else None) for dq, q in graph.pairs()]
    assert pairs == [("x.dequantize", "x.quantize"), ("conv.w.dequantize", "conv.w.quantize")]
    act = graph.qparams(graph.dq_of("x.dq"))
    assert float(act.scale) == pytest.approx(models_lint.ACT_SCALE) and int(act.zero_point) == 5
    assert (act.axis, act.int_dtype) == (1, np.int8)
    [(node, dq, weight)] = list(graph.weight_inputs())
    assert (node.name, dq.name, weight.shape) == ("conv", "conv.w.dequantize", (12, 16, 3, 3))
    assert graph.qparams(dq).scale.shape == (12,) and graph.is_weight(dq) and not graph.is_weight(
        graph.dq_of("x.dq"))
    assert graph.producer_op("y") == "Conv" and graph.producer_op("x") is None
    assert [c.name for c in graph.quantized_consumers("x")] == ["x.quantize"]


def test_weighted_source_follows_one_pair_back_to_a_weighted_op():
    graph = QdqGraph(models_lint.qdq_between_conv_and_add())  # conv -> Q/DQ -> Add <- Q/DQ <- x
    assert graph.weighted_source("conv_out.dq").name == "conv"
    assert graph.weighted_source("x.dq") is None  # the residual comes from an input
    assert graph.weighted_source("conv_out") is None  # not behind a Q/DQ pair


def _node(op: str, **attrs: object):
    return helper.make_node(op, ["x", "w"], ["y"], name=op.lower(), **attrs)


@pytest.mark.parametrize("op, attrs, shape, channels, axis", [
    ("Conv", {}, (8, 3, 3, 3), (3, 8), 0),
    ("Conv", {"group": 4}, (8, 2, 3, 3), (8, 8), 0),                 # depthwise-style: C_in = 2 x 4 groups
    ("ConvTranspose", {"group": 2}, (6, 5, 3, 3), (6, 10), 1),        # weight [C_in, C_out / group, ...]
    ("Gemm", {}, (16, 4), (16, 4), 1),
    ("Gemm", {"transB": 1}, (4, 16), (16, 4), 0),
    ("MatMul", {}, (2, 16, 4), (16, 4), 2),
])
def test_channel_counts_and_output_channel_axis_by_hand(op, attrs, shape, channels, axis):
    node = _node(op, **attrs)
    assert channel_counts(node, np.zeros(shape, np.float32)) == channels
    assert output_channel_axis(node, len(shape)) == axis


def test_names_and_previews_for_messages():
    q = helper.make_node("QuantizeLinear", [], [], name="q")
    dq = helper.make_node("DequantizeLinear", [], [], name="dq")
    assert pair_name(dq, q) == "'q' -> 'dq'" and pair_name(dq, None) == "'dq'"
    assert preview(np.array([0.01, 0.02, 0.03, 0.04, 0.05])) == "[0.01, 0.02, 0.03, 0.04, ...]"
    assert preview(np.array(5)) == "5" and preview(np.array([1.5, 2])) == "[1.5, 2]"


@pytest.fixture
def external_int8(tmp_path):
    """A Q/DQ model whose four 64 x 64 weights are in its data file."""
    width = 64
    fp32 = models_large.matmul_stack(tmp_path, 4 * width * width * 4, width)
    np.savez(tmp_path / "calib.npz", x=models_large.inputs(width, 16))
    path = tmp_path / "int8.onnx"
    quantize(fp32, tmp_path / "calib.npz").save(path)
    return path


def test_the_lint_reads_weights_kept_in_their_data_file_one_at_a_time(external_int8, monkeypatch):
    reads: list[tuple[str, weakref.ref]] = []
    read = qdq_graph.tensor_array

    def counting(tensor):
        values = read(tensor)
        if is_external(tensor):
            alive = [name for name, ref in reads if ref() is not None]
            assert not alive, f"weights {alive} still held while {tensor.name!r} is read"
            reads.append((tensor.name, weakref.ref(values)))
        return values

    monkeypatch.setattr(qdq_graph, "tensor_array", counting)
    graph = QdqGraph(load_model(external_int8, allow_quantized=True))
    assert {weight.shape for _, _, weight in graph.weight_inputs()} == {(64, 64)}
    assert not reads  # the view and its weights' shapes read no weight
    report = lint(external_int8)
    weights = {f"w{i}" for i in range(4)}
    assert {name for name, _ in reads} == weights  # each weight measured, one at a time
    assert len(reads) <= 2 * len(weights)  # by the clipped-weight and per-tensor-weight rules
    assert report.findings == lint(onnx.load(str(external_int8))).findings  # every weight in memory
