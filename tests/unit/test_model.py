"""load_model: validation, opset conversion, quantized-input detection, external data, atomic save."""
from __future__ import annotations

import models
import numpy as np
import onnx
import onnx_graphsurgeon as gs
import pytest
from onnx import helper

from quantdbg.errors import ModelError
from quantdbg.model import load_model, save_model
from quantdbg.model.external import tensor_array
from quantdbg.model.graph import is_float, trans_b
from quantdbg.model.load import quantized_nodes
from quantdbg.model.names import check_node_globs, name_nodes, node_names
from quantdbg.model.specs import input_specs


def test_load_copies_and_never_modifies_the_argument():
    original = models.conv_relu()
    before = original.SerializeToString()
    loaded = load_model(original)
    loaded.graph.node[0].name = "changed"
    assert original.SerializeToString() == before


def test_old_opset_is_converted_to_13():
    model = models.mlp()
    del model.opset_import[:]
    model.opset_import.append(helper.make_opsetid("", 11))  # Gemm/Relu/MatMul/Add are valid at 11
    loaded = load_model(model)
    assert {o.version for o in loaded.opset_import if o.domain in ("", "ai.onnx")} == {13}


def test_already_quantized_model_is_reported_with_the_node():
    x = helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 4])
    scale = helper.make_tensor("s", onnx.TensorProto.FLOAT, [], [0.1])
    zp = helper.make_tensor("z", onnx.TensorProto.INT8, [], [0])
    graph = helper.make_graph([
        helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], name="q_in"),
        helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"], name="dq_in"),
    ], "g", [x], [y], [scale, zp])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(ModelError, match=r"already quantized: 2 node\(s\) such as 'q_in' \(QuantizeLinear\)"):
        load_model(model)
    assert quantized_nodes(load_model(model, allow_quantized=True)) == ["q_in", "dq_in"]


def test_missing_file_names_the_path(tmp_path):
    with pytest.raises(ModelError, match="does not exist"):
        load_model(tmp_path / "nope.onnx")


def test_external_data_outside_the_model_folder_is_refused(tmp_path):
    model = models.mlp()
    inner = tmp_path / "inner"
    inner.mkdir()
    onnx.save(model, str(inner / "m.onnx"), save_as_external_data=True, all_tensors_to_one_file=True,
              location="w.bin", size_threshold=0)
    (tmp_path / "w.bin").write_bytes((inner / "w.bin").read_bytes())
    m = onnx.load(str(inner / "m.onnx"), load_external_data=False)
    for init in m.graph.initializer:
        for entry in init.external_data:
            if entry.key == "location":
                entry.value = "../w.bin"
    (inner / "evil.onnx").write_bytes(m.SerializeToString())  # onnx.save would rewrite the data
    with pytest.raises(ModelError,
                       match=r"points to external data '\.\./w\.bin', outside the model's folder"):
        load_model(inner / "evil.onnx")
    loaded = load_model(inner / "m.onnx")  # data beside the model is read, on demand
    w = {i.name: tensor_array(i) for i in loaded.graph.initializer}
    ref = {i.name: onnx.numpy_helper.to_array(i) for i in models.mlp().graph.initializer}
    np.testing.assert_array_equal(w["fc1.w"], ref["fc1.w"])


def test_input_specs_keep_dynamic_dims():
    specs = input_specs(load_model(models.conv_relu()))
    assert list(specs) == ["x"]
    assert specs["x"].shape == ("N", 3, 8, 8)
    assert specs["x"].dtype == np.float32


def test_name_nodes_gives_unique_deterministic_names():
    model = models.mlp()
    model.graph.node[0].name = ""
    model.graph.node[2].name = model.graph.node[1].name
    names = [n.name for n in name_nodes(model).graph.node]
    assert names == ["Gemm_0", "relu", "MatMul_2", "fc2_bias"]


def test_save_is_atomic_and_leaves_no_temporary_file(tmp_path):
    model = models.conv_relu()
    path = save_model(model, tmp_path / "out.onnx")
    assert [p.name for p in tmp_path.iterdir()] == ["out.onnx"]
    assert onnx.load(str(path)).SerializeToString() == model.SerializeToString()
    with pytest.raises(ModelError, match="does not exist"):
        save_model(model, tmp_path / "missing" / "out.onnx")


def test_node_names_keep_unique_names_and_name_the_rest_by_op_and_index():
    pairs = [("conv", "Conv"), ("", "Relu"), ("conv", "Conv"), ("Relu_1", "Add"), ("Relu_1", "Mul")]
    assert node_names(pairs) == ["conv", "Relu_1", "Conv_2", "Add_3", "Mul_4"]


def test_check_node_globs_names_the_setting_and_suggests_close_names():
    check_node_globs("QuantConfig.exclude", ["conv*", "relu"], ["conv1", "conv2", "relu"])
    with pytest.raises(ModelError) as err:
        check_node_globs("SmoothingConfig.nodes", ["conv*", "rleu"], ["conv1", "conv2", "relu"])
    assert str(err.value) == ("SmoothingConfig.nodes entry 'rleu' matches no node. No node named 'rleu' in "
                              "the model. Did you mean 'relu'?")


def test_save_puts_the_weights_of_a_model_past_2_gb_beside_it(tmp_path, monkeypatch):
    import quantdbg.model.save as M

    model = models.conv_relu(channels=16)  # a 1.7 kB weight: past onnx's 1 kB threshold for external data
    monkeypatch.setattr(M, "fits_in_protobuf", lambda m: False)  # as for a model past protobuf's 2 GB
    path = save_model(model, tmp_path / "big.onnx")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["big.onnx", "big.onnx.data"]
    stored = onnx.load(str(path), load_external_data=False)
    assert any(init.data_location == onnx.TensorProto.EXTERNAL for init in stored.graph.initializer)
    again = onnx.load(str(path))
    for mine, theirs in zip(model.graph.initializer, again.graph.initializer, strict=True):
        np.testing.assert_array_equal(onnx.numpy_helper.to_array(mine), onnx.numpy_helper.to_array(theirs))
    assert model.graph.initializer[0].data_location == onnx.TensorProto.DEFAULT  # the caller's is untouched


def test_is_float_reads_the_numpy_and_onnx_dtypes_gs_holds():
    assert is_float(gs.Variable("a", np.float32)) and is_float(gs.Variable("unknown"))
    assert not is_float(gs.Variable("h", np.float16)) and not is_float(gs.Variable("i", np.int64))
    assert not is_float(gs.Variable("bf16", onnx.TensorProto.BFLOAT16))  # gs keeps it as an onnx enum


def test_trans_b_reads_gemm_nodes_of_gs_and_onnx_alike():
    def onnx_gemm(**attrs: int) -> onnx.NodeProto:
        return helper.make_node("Gemm", ["a", "b"], ["y"], **attrs)

    def gs_node(op: str, **attrs: int) -> gs.Node:
        return gs.Node(op, attrs=attrs)

    assert trans_b(onnx_gemm(transB=1)) and trans_b(gs_node("Gemm", transB=1))
    assert not trans_b(onnx_gemm(transB=0)) and not trans_b(gs_node("Gemm", transB=0))
    assert not trans_b(onnx_gemm()) and not trans_b(gs_node("Gemm"))  # the ONNX default is 0
    assert not trans_b(onnx_gemm(transA=1)) and not trans_b(gs_node("Gemm", transA=1))
    matmul = helper.make_node("MatMul", ["a", "b"], ["y"])
    assert not trans_b(matmul) and not trans_b(gs_node("MatMul", transB=1))
    assert not trans_b(None)
