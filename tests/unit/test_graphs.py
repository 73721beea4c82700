"""Graphs of the sensitivity analysis: switch, local and paired graphs against NumPy and the models."""
from __future__ import annotations

import models_sensitivity as ms
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

from quantdbg.config import TensorKind
from quantdbg.errors import ModelError
from quantdbg.model import load_model
from quantdbg.model.names import name_nodes
from quantdbg.qdq import QdqRecord
from quantdbg.sensitivity.graphs import (
    ENABLE_PREFIX,
    LOCAL_SUFFIX,
    QUANT_PREFIX,
    REDUCTIONS,
    LocalVariant,
    local_graph,
    paired_graph,
    switch_graph,
)


def _session(model: onnx.ModelProto) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.add_session_config_entry("session.disable_quant_qdq", "1")  # Q/DQ as ONNX defines it
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


@pytest.fixture(scope="module")
def mlp():
    """(FP32 model with named nodes, feeds, Q/DQ model) of the 4-layer MLP."""
    model = ms.mlp4()
    feeds = ms.feeds_for(model, np.random.default_rng(3))
    return name_nodes(load_model(model)), feeds, ms.quantize_by_hand(model, feeds)


def _fake_quant(x: np.ndarray, record: QdqRecord, amax: float | None = None) -> np.ndarray:
    """Symmetric INT8 fake quantization in float32, as ONNX's QuantizeLinear/DequantizeLinear do."""
    scale = np.float32(amax / 127) if amax is not None else np.asarray(record.scale, np.float32)
    lo = -128 if record.kind is TensorKind.ACTIVATION else -127
    return (np.clip(np.round(x / scale), lo, 127) * scale).astype(np.float32)


def _exposed(model: onnx.ModelProto, feeds: list[dict[str, np.ndarray]], tensors: list[str]) -> list[list]:
    """Per feed, the values of ``tensors`` (exposed as outputs), Q/DQ computed as ONNX defines it."""
    exposed = onnx.ModelProto()
    exposed.CopyFrom(model)
    exposed.graph.output.extend(onnx.helper.make_tensor_value_info(t, onnx.TensorProto.FLOAT, None)
                                for t in tensors)
    session = _session(exposed)
    return [session.run(tensors, feed) for feed in feeds]


def _reductions(values: dict[str, np.ndarray], names: tuple[str, ...]) -> dict[str, float]:
    return {kind: float(values[name]) for kind, name in zip(REDUCTIONS, names, strict=True)}


def _oracle(ref: np.ndarray, test: np.ndarray) -> dict[str, float]:
    ref, test = ref.astype(np.float64), test.astype(np.float64)
    diff = test - ref
    return {"signal": (ref**2).sum(), "noise": (diff**2).sum(), "test": (test**2).sum(), "max": diff.max(),
            "min": diff.min(), "count": ref.size}


# ----- switch graph ---------------------------------------------------------------------------

def test_switch_graph_has_one_boolean_switch_per_layer_and_one_if_per_record(mlp):
    fp, _, qmodel = mlp
    switch = switch_graph(qmodel, fp)
    assert switch.layers == qmodel.layers
    assert dict(switch.switches) == {layer: f"{ENABLE_PREFIX}{layer}" for layer in qmodel.layers}
    inputs = {i.name: i.type.tensor_type for i in switch.model.graph.input}
    for name in switch.switches.values():
        assert inputs[name].elem_type == onnx.TensorProto.BOOL and len(inputs[name].shape.dim) == 0
    ifs = [n for n in switch.model.graph.node if n.op_type == "If"]
    assert len(ifs) == len(qmodel.records)
    assert {n.input[0] for n in ifs} == set(switch.switches.values())
    assert not {n.op_type for n in switch.model.graph.node} & {"QuantizeLinear", "DequantizeLinear"}
    feed = switch.feed(["fc1"])
    assert {k: bool(v) for k, v in feed.items()} == {f"{ENABLE_PREFIX}{n}": n == "fc1" for n in qmodel.layers}
    assert all(v.shape == () and v.dtype == np.bool_ for v in feed.values())


def test_switched_off_layers_compute_exactly_in_fp32(mlp):
    fp, feeds, qmodel = mlp
    switch = switch_graph(qmodel, fp)
    session, fp_session = _session(switch.model), _session(fp)
    for feed in feeds:
        off = session.run(None, {**feed, **switch.feed(())})[0]
        np.testing.assert_array_equal(off, fp_session.run(None, feed)[0])


def test_switched_on_weights_are_folded_to_their_numpy_fake_quantization(mlp):
    fp, _, qmodel = mlp
    switch = switch_graph(qmodel, fp)
    constants = {i.name: numpy_helper.to_array(i) for i in switch.model.graph.initializer}
    fp_weights = {i.name: numpy_helper.to_array(i) for i in fp.graph.initializer}
    for record in (r for r in qmodel.records if r.kind is TensorKind.WEIGHT):
        folded = constants[f"{record.tensor}/fake_quantized"]
        np.testing.assert_array_equal(folded, _fake_quant(fp_weights[record.tensor], record))


def test_one_switch_on_equals_numpy_fake_quantization_of_that_layer(mlp):
    fp, feeds, qmodel = mlp
    switch = switch_graph(qmodel, fp)
    weights = {i.name: numpy_helper.to_array(i) for i in fp.graph.initializer}
    act, weight = sorted(qmodel.records_of("fc0"), key=lambda r: r.input_index)
    found = _exposed(switch.model, [{**f, **switch.feed(["fc0"])} for f in feeds], ["mm0"])
    for feed, (got,) in zip(feeds, found, strict=True):
        want = _fake_quant(feed["x"], act) @ _fake_quant(weights[weight.tensor], weight)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


# ----- local graph ----------------------------------------------------------------------------

def test_local_graph_keeps_the_fp32_model_and_adds_one_clone_per_variant(mlp):
    fp, feeds, qmodel = mlp
    variants = [LocalVariant("fc1", "recorded", {}), LocalVariant("fc1", "wide", {0: 100.0}),
                LocalVariant("fc3", "recorded", {})]
    graph = local_graph(fp, qmodel, variants)
    assert graph.variants == tuple(variants)
    assert set(graph.outputs) == {(0, 0), (1, 0), (2, 0)}
    clones = [n.name for n in graph.model.graph.node if n.op_type == "MatMul" and LOCAL_SUFFIX in n.name]
    assert clones == [f"fc1{LOCAL_SUFFIX}", f"fc1{LOCAL_SUFFIX}_1", f"fc3{LOCAL_SUFFIX}"]
    assert [o.name for o in graph.model.graph.output][:1] == ["y"]  # the model's own output comes first
    out = _session(graph.model).run(["y"], feeds[0])[0]
    np.testing.assert_array_equal(out, _session(fp).run(None, feeds[0])[0])  # FP32 path untouched


def test_local_reductions_equal_numpy_sums_of_the_clone_error(mlp):
    fp, feeds, qmodel = mlp
    variants = [LocalVariant("fc2", "recorded", {}), LocalVariant("fc2", "wide", {0: 50.0})]
    graph = local_graph(fp, qmodel, variants)
    names = [n for outs in graph.outputs.values() for n in outs]
    session = _session(graph.model)
    act, weight = sorted(qmodel.records_of("fc2"), key=lambda r: r.input_index)
    weights = {i.name: numpy_helper.to_array(i) for i in fp.graph.initializer}
    w = _fake_quant(weights[weight.tensor], weight)
    exposed = ms.run_exposed(fp, feeds, ["act1", "mm2"])
    for i, feed in enumerate(feeds):
        values = dict(zip(names, session.run(names, feed), strict=True))
        for index, amax in ((0, None), (1, 50.0)):
            test = _fake_quant(exposed["act1"][i], act, amax) @ w
            want = _oracle(exposed["mm2"][i], test)
            got = _reductions(values, graph.outputs[(index, 0)])
            assert got["count"] == want["count"]
            for kind in ("signal", "noise", "test", "max", "min"):
                assert got[kind] == pytest.approx(want[kind], rel=1e-4, abs=1e-6), kind


def test_local_graph_refuses_a_layer_missing_from_the_fp32_model(mlp):
    fp, _, qmodel = mlp
    with pytest.raises(ModelError, match=r"^Quantized node 'nope' is not in the FP32 model; pass the FP32 "
                                         r"original of the Q/DQ model \(node names must match\)\.$"):
        local_graph(fp, qmodel, [LocalVariant("nope", "recorded", {})])


# ----- paired graph ---------------------------------------------------------------------------

def test_paired_graph_with_every_switch_off_has_zero_noise(mlp):
    fp, feeds, qmodel = mlp
    switch = switch_graph(qmodel, fp)
    pairs = {t: t for t in ("mm0", "act0", "mm1", "act1", "mm2", "y")}
    graph = paired_graph(fp, switch.model, pairs)
    assert dict(graph.quant_outputs) == {"y": f"{QUANT_PREFIX}y"}
    assert set(graph.reductions) == set(pairs)
    assert all(n.name.startswith(QUANT_PREFIX) for n in graph.model.graph.node
               if n.op_type == "If")  # the quantized copy's nodes are renamed, the FP32 ones kept
    session = _session(graph.model)
    names = [n for outs in graph.reductions.values() for n in outs]
    for feed in feeds:
        values = dict(zip(names, session.run(names, {**feed, **switch.feed(())}), strict=True))
        for tensor, outs in graph.reductions.items():
            got = _reductions(values, outs)
            assert got["noise"] == got["max"] == got["min"] == 0.0, tensor
            assert got["signal"] == got["test"] > 0.0


def test_paired_reductions_equal_numpy_comparisons_of_both_models(mlp):
    fp, feeds, qmodel = mlp
    switch = switch_graph(qmodel, fp)
    graph = paired_graph(fp, switch.model, {"act1": "act1", "y": "y"})
    session = _session(graph.model)
    fp_values = _exposed(fp, feeds, ["act1"])
    q_values = _exposed(qmodel.model, feeds, ["act1"])
    names = [n for outs in graph.reductions.values() for n in outs]
    for i, feed in enumerate(feeds):
        values = dict(zip(names, session.run(names, {**feed, **switch.feed(qmodel.layers)}), strict=True))
        for tensor, (fp_value, q_value) in (("act1", (fp_values[i][0], q_values[i][0])),
                                            ("y", (_session(fp).run(None, feed)[0],
                                                   _session(qmodel.model).run(None, feed)[0]))):
            want = _oracle(fp_value, q_value)
            got = _reductions(values, graph.reductions[tensor])
            for kind in REDUCTIONS:
                assert got[kind] == pytest.approx(want[kind], rel=1e-4, abs=1e-5), (tensor, kind)
