"""Smoothing's planning and folding, directly on small onnx-graphsurgeon graphs: which nodes share one
``s`` and why others are skipped (plan), and when ``1/s`` may move into the producer (fold)."""
from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs
import pytest

from quantdbg.calibration import SmoothingConfig
from quantdbg.calibration.smoothing.fold import fold_inverse, replace_constant
from quantdbg.calibration.smoothing.plan import plan_groups, row_axis
from quantdbg.errors import ModelError
from quantdbg.model.names import UniqueNames


def _w(name: str, shape: tuple[int, ...], dtype=np.float32) -> gs.Constant:
    return gs.Constant(name, np.ones(shape, dtype))


def _var(name: str, shape=None, dtype=np.float32) -> gs.Variable:
    return gs.Variable(name, dtype, shape)


def _graph_of_every_case() -> gs.Graph:
    x = _var("x", ("N", 8))
    t = _var("t")  # channels unknown: a mismatch shows only between the weights of its readers
    ids = _var("ids", ("N", 8), np.int64)
    nodes = [
        gs.Node("MatMul", "ok", inputs=[x, _w("w_ok", (8, 4))], outputs=[_var("o1")]),
        gs.Node("Gemm", "ok_transb", {"transB": 1}, inputs=[x, _w("w_tb", (4, 8))], outputs=[_var("o2")]),
        gs.Node("MatMul", "const_act", inputs=[_w("c", (2, 8)), _w("w_c", (8, 4))], outputs=[_var("o3")]),
        gs.Node("MatMul", "act_act", inputs=[x, _var("y", (8, 4))], outputs=[_var("o4")]),
        gs.Node("MatMul", "rank3", inputs=[x, _w("w3", (2, 8, 4))], outputs=[_var("o5")]),
        gs.Node("MatMul", "half", inputs=[x, _w("w16", (8, 4), np.float16)], outputs=[_var("o6")]),
        gs.Node("Gemm", "trans_a", {"transA": 1}, inputs=[x, _w("w_ta", (8, 4))], outputs=[_var("o7")]),
        gs.Node("MatMul", "wrong_k", inputs=[x, _w("w_k6", (6, 4))], outputs=[_var("o8")]),
        gs.Node("MatMul", "int_act", inputs=[ids, _w("w_i", (8, 4))], outputs=[_var("o9")]),
        gs.Node("MatMul", "t8", inputs=[t, _w("w_t8", (8, 4))], outputs=[_var("o10")]),
        gs.Node("MatMul", "t6", inputs=[t, _w("w_t6", (6, 4))], outputs=[_var("o11")]),
        gs.Node("Relu", "relu", inputs=[x], outputs=[_var("o12")]),
    ]
    return gs.Graph(nodes, [x, t, ids], [])


def test_plan_groups_readers_of_one_activation_and_gives_every_skip_its_reason():
    groups, skipped = plan_groups(_graph_of_every_case(), SmoothingConfig())
    assert [(g.tensor.name, [n.name for n in g.nodes], g.channels) for g in groups] == [
        ("x", ["ok", "ok_transb"], 8), ("t", ["t8"], 8)]
    assert {s.node: s.reason for s in skipped} == {
        "const_act": "input 0 is a constant, not an activation",
        "act_act": "input 1 ('y') is not an initializer (an activation-by-activation product)",
        "rank3": "weight 'w3' is float32 of rank 3; only 2-D float32 weights are smoothed",
        "half": "weight 'w16' is float16 of rank 2; only 2-D float32 weights are smoothed",
        "trans_a": "Gemm with transA=1 (its channels are not on the last axis)",
        "wrong_k": "activation 'x' has 8 channels but weight 'w_k6' expects 6",
        "int_act": "activation 'ids' is not float32",
        "t6": "its weight has 6 input channels but other nodes reading 't' have 8",
    }


def test_plan_selection_and_globs():
    graph = _graph_of_every_case()
    groups, skipped = plan_groups(graph, SmoothingConfig(op_types=("Gemm",), exclude=("trans_*",)))
    assert [[n.name for n in g.nodes] for g in groups] == [["ok_transb"]] and skipped == []
    with pytest.raises(ModelError) as err:
        plan_groups(graph, SmoothingConfig(exclude=("trans_b",)))
    assert str(err.value) == ("SmoothingConfig.exclude entry 'trans_b' matches no node. No node named "
                              "'trans_b' in the model. Did you mean 'trans_a', 'ok_transb'?")


def test_row_axis_is_the_input_channel_axis_of_the_weight():
    assert row_axis(gs.Node("MatMul")) == 0 and row_axis(gs.Node("Gemm")) == 0
    assert row_axis(gs.Node("Gemm", attrs={"transB": 1})) == 1


def _layernorm_into_matmul(axis: int = -1, extra_reader: str | None = None, output: bool = False):
    x = _var("x", ("N", 5, 8))
    ln = _var("ln", ("N", 5, 8))
    gamma = gs.Constant("gamma", np.full(8, 2.0, np.float32))
    beta = gs.Constant("beta", np.ones(8, np.float32))
    mm = gs.Node("MatMul", "mm", inputs=[ln, _w("w", (8, 4))], outputs=[_var("y")])
    nodes = [gs.Node("LayerNormalization", "norm", {"axis": axis}, inputs=[x, gamma, beta], outputs=[ln]), mm]
    if extra_reader is not None:
        nodes.append(gs.Node(extra_reader, "reader", inputs=[ln], outputs=[_var("r")]))
    graph = gs.Graph(nodes, [x], [ln] if output else [])
    groups, _ = plan_groups(graph, SmoothingConfig())
    return graph, groups[0], gamma, beta


@pytest.mark.parametrize("case, folds", [
    ({}, True), ({"extra_reader": "Shape"}, True),  # a shape reader does not see the values
    ({"extra_reader": "Relu"}, False), ({"output": True}, False), ({"axis": 1}, False),
])
def test_fold_into_layernorm_only_where_legal(case, folds):
    graph, group, gamma, beta = _layernorm_into_matmul(**case)
    scale = np.array([1, 2, 4, 8, 1, 2, 4, 8], np.float32)
    outputs = {t.name for t in graph.outputs}
    got = fold_inverse(group, scale, outputs, UniqueNames.of_graph(graph))
    if not folds:
        assert got is None
        assert np.array_equal(gamma.values, np.full(8, 2.0)) and np.array_equal(beta.values, np.ones(8))
        return
    assert got == ("layernorm", "norm")
    np.testing.assert_array_equal(gamma.values, 2.0 / scale)
    np.testing.assert_array_equal(beta.values, 1.0 / scale)


def test_replace_constant_copies_a_shared_initializer():
    shared = gs.Constant("w", np.ones((2, 2), np.float32))
    a = gs.Node("MatMul", "a", inputs=[_var("x"), shared], outputs=[_var("ya")])
    b = gs.Node("MatMul", "b", inputs=[_var("x2"), shared], outputs=[_var("yb")])
    names = UniqueNames({"w"})
    replace_constant(shared, np.full((2, 2), 3.0), [(a, 1)], names)
    assert a.inputs[1].name == "w/smoothed" and np.array_equal(a.inputs[1].values, np.full((2, 2), 3.0))
    assert b.inputs[1] is shared and np.array_equal(shared.values, np.ones((2, 2)))
    replace_constant(shared, np.full((2, 2), 5.0), [(b, 1)], names)  # its last reader: in place
    assert b.inputs[1] is shared and shared.values.dtype == np.float32 and shared.values[0, 0] == 5.0
