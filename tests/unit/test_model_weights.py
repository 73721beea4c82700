"""Weight discovery: the same model in every form real exporters write weights in quantizes the same,
and every weight held outside a plain initializer is folded and recorded."""
from __future__ import annotations

import json

import export_forms
import models_lint
import models_weights
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

import quantdbg
from quantdbg.config import TensorKind
from quantdbg.errors import ModelError
from quantdbg.model import load_model
from quantdbg.model.load import as_loaded
from quantdbg.model.specs import input_specs
from quantdbg.model.weights import (
    FoldedWeight,
    computed_constants,
    constant_tensors,
    fold_weights,
    summarize_folded,
)
from quantdbg.placement import plan_qdq

BUILDERS = {"cnn": models_weights.small_cnn, "attention": models_weights.attention_block}
SHAPES = {"cnn": (3, 8, 8), "attention": (5, 8)}


def _model(kind: str) -> onnx.ModelProto:
    return export_forms.fp16_exact(BUILDERS[kind]())


def _data(kind: str, n: int = 24) -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(1).standard_normal((n, *SHAPES[kind])).astype(np.float32)}


def _run(model: onnx.ModelProto, feed: dict[str, np.ndarray]) -> np.ndarray:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, feed)[0]


@pytest.fixture(scope="module", params=sorted(BUILDERS))
def quantized_forms(request):
    """Every form of one model quantized (minmax): form -> (form model, QuantizedModel)."""
    kind = request.param
    data = _data(kind)
    out = {}
    for form in export_forms.FORMS:
        model = export_forms.form(_model(kind), form)
        out[form] = (model, quantdbg.quantize(model, data, quantdbg.CalibConfig(method="minmax")))
    return kind, out


def _weight_targets(qmodel) -> dict[tuple[str, int], tuple[TensorKind, int | None, tuple[float, ...]]]:
    return {(r.node, r.input_index): (r.kind, r.axis, r.scale) for r in qmodel.records}


def test_every_form_gives_the_same_targets_scales_and_outputs(quantized_forms):
    kind, forms = quantized_forms
    _, reference = forms["initializers"]
    feed = {"x": _data(kind, 4)["x"]}
    expected = _run(reference.model, feed)
    assert any(r.kind is TensorKind.WEIGHT and r.axis is not None for r in reference.records)
    for form, (_, qmodel) in forms.items():
        assert _weight_targets(qmodel) == _weight_targets(reference), form
        assert qmodel.calibration.scales() == reference.calibration.scales(), form
        np.testing.assert_array_equal(_run(qmodel.model, feed), expected, err_msg=form)


def test_no_statistics_are_collected_for_a_tensor_constants_compute(quantized_forms):
    _, forms = quantized_forms
    for form, (model, qmodel) in forms.items():
        constant = constant_tensors(model)
        assert qmodel.calibration.stats, form
        assert not set(qmodel.calibration.stats) & constant, form
        assert set(qmodel.calibration.stats) == set(qmodel.calibration.ranges), form


def test_each_form_records_how_its_weights_were_held(quantized_forms):
    kind, forms = quantized_forms
    weights = {(r.node, r.input_index, r.tensor) for r in forms["initializers"][1].records
               if r.kind is TensorKind.WEIGHT}
    assert forms["initializers"][1].calibration.folded_weights == ()
    for form in ("constants", "fp16", "inputs"):
        folded = forms[form][1].calibration.folded_weights
        assert {(f.node, f.input_index, f.tensor) for f in folded} == weights, form
    assert {f.ops for f in forms["constants"][1].calibration.folded_weights} == {("Constant",)}
    assert {f.ops for f in forms["fp16"][1].calibration.folded_weights} == {("Cast",)}
    assert {f.ops for f in forms["inputs"][1].calibration.folded_weights} == {()}
    transposed = forms["transposed"][1].calibration.folded_weights
    matmuls = {(n, i) for n, i, _ in weights if n in {"fc", "q_proj", "k_proj", "v_proj", "out_proj"}}
    assert {(f.node, f.input_index) for f in transposed} == matmuls
    for f in transposed:
        stored = f.tensor.replace("/transposed", "/stored_transposed")
        assert (f.ops, f.sources) == (("Transpose",), (stored,))


def test_loading_folds_on_a_copy_and_leaves_the_callers_model_alone():
    model = export_forms.constants(_model("cnn"))
    before = model.SerializeToString()
    loaded = as_loaded(model)
    assert model.SerializeToString() == before
    # The biases (input 2) are no weights TensorRT quantizes: their Constant nodes stay.
    assert [n.name for n in loaded.proto.graph.node if n.op_type == "Constant"] == [
        "conv1.b/Constant", "fc.b/Constant"]
    assert {i.name for i in loaded.proto.graph.initializer} >= {"conv1.w", "conv2.w", "fc.w"}
    onnx.checker.check_model(loaded.proto)
    np.testing.assert_array_equal(_run(loaded.proto, _data("cnn", 2)), _run(model, _data("cnn", 2)))


def test_graph_inputs_that_shadow_initializers_are_dropped():
    model = export_forms.inputs(_model("cnn"))
    model.ir_version = 3
    loaded = as_loaded(model)
    assert [vi.name for vi in loaded.proto.graph.input] == ["x"]
    assert loaded.proto.ir_version >= 4
    assert list(input_specs(loaded.proto)) == ["x"]
    assert {f.held for f in loaded.folded} == {"initializer also listed as a graph input"}
    assert {f.action for f in loaded.folded} == {"dropped from the graph inputs"}


def test_a_clean_export_is_returned_as_it_is():
    model = load_model(models_weights.small_cnn())
    assert fold_weights(model) == (model, ())


def test_a_weight_shared_by_two_nodes_is_folded_once_and_quantized_for_both():
    loaded = as_loaded(models_weights.shared_constant_weight())
    assert [(f.node, f.input_index, f.tensor, f.ops) for f in loaded.folded] == [
        ("proj_a", 1, "w", ("Constant",)), ("proj_b", 1, "w", ("Constant",))]
    assert [i.name for i in loaded.proto.graph.initializer] == ["w"]
    weights = [(t.node, t.tensor, t.axis) for t in plan_qdq(loaded).targets if t.kind is TensorKind.WEIGHT]
    assert weights == [("proj_a", "w", 1), ("proj_b", "w", 1)]


def test_constants_that_compute_no_weight_stay_as_they_are():
    loaded = as_loaded(models_weights.reshape_with_constant_shape())
    assert [(n.op_type, n.name) for n in loaded.proto.graph.node] == [
        ("Constant", "shape/Constant"), ("MatMul", "proj"), ("Reshape", "reshape")]
    assert [i.name for i in loaded.proto.graph.initializer] == ["w"]


def test_a_chain_onnx_runtime_cannot_evaluate_is_one_error_naming_the_node():
    with pytest.raises(ModelError) as err:
        load_model(models_weights.weight_behind_custom_op())
    assert str(err.value) == (
        "Input 1 ('w') of node 'proj' is a weight computed from constants by Rescale node 'w/Rescale', and "
        "ONNX Runtime could not evaluate it. Export the model with this weight as an initializer.")


def test_a_quantized_model_is_never_folded():
    model = models_lint.per_tensor_weight()
    loaded = as_loaded(model, allow_quantized=True)
    assert loaded.folded == () and loaded.quantized
    assert [n.op_type for n in loaded.proto.graph.node] == [n.op_type for n in model.graph.node]


def test_constant_tensors_skip_random_and_qdq_ops_and_graph_inputs():
    model = load_model(models_weights.shared_constant_weight())
    assert constant_tensors(model) == {"w"}
    qdq = models_lint.per_tensor_weight()
    constant = constant_tensors(qdq)
    assert "conv.w" in constant and "conv.w.q" not in constant and "x" not in constant


def test_computed_constants_evaluates_chains_and_leaves_out_the_rest():
    model = load_model(export_forms.transposed(_model("attention")))  # folded: no chain left
    assert computed_constants(model, ["q.w/transposed", "x"]) == {}
    raw = export_forms.transposed(_model("attention"))
    stored = {i.name: numpy_helper.to_array(i) for i in raw.graph.initializer}
    values = computed_constants(raw, ["q.w/transposed", "x", "q"])
    assert list(values) == ["q.w/transposed"]
    np.testing.assert_array_equal(values["q.w/transposed"], stored["q.w/stored_transposed"].T)


def test_folded_weight_descriptions_and_json_round_trip():
    items = (FoldedWeight("conv", 1, "w", ("Constant",)),
             FoldedWeight("fc", 1, "w_t", ("Transpose",), ("w_stored",)),
             FoldedWeight("fc2", 1, "w2", ("Constant", "Cast")),
             FoldedWeight("fc3", 1, "w3", ()))
    assert [f.held for f in items] == ["Constant node", "Transpose of initializer 'w_stored'",
                                       "Cast of a Constant node", "initializer also listed as a graph input"]
    assert [f.kind for f in items] == ["in Constant nodes", "behind Transpose", "behind Cast",
                                       "initializers also listed as graph inputs"]
    assert items[1].describe() == ("fc input 1 'w_t': Transpose of initializer 'w_stored', folded into an "
                                   "initializer")
    assert summarize_folded(items) == (
        "4 weight(s) were not plain initializers (1 in Constant nodes, 1 behind Transpose, 1 behind Cast, "
        "1 initializers also listed as graph inputs): folded into initializers and dropped from the graph "
        "inputs")
    for item in items:
        assert FoldedWeight.from_dict(json.loads(json.dumps(item.to_dict()))) == item
