"""How a model is stored changes nothing: every tensor external, a hard-linked data file, odd text fields."""
from __future__ import annotations

import hashlib
import os

import models_sensitivity as ms
import numpy as np
import onnx
import onnx_graphsurgeon as gs
import pytest
from models import _const, _finish

from quantdbg.cli import main
from quantdbg.config import CalibConfig
from quantdbg.errors import ModelError
from quantdbg.model import load_model
from quantdbg.model.external import INLINE_BELOW, is_external, tensor_array
from quantdbg.qdq import quantize


def _conv_reshape_fc() -> onnx.ModelProto:
    """x[N,3,8,8] -> Conv -> Relu -> Reshape(shape initializer [-1, 256]) -> MatMul -> y[N,10].

    The Reshape's shape is an initializer (no Constant node): shape inference must read its values.
    """
    rng = np.random.default_rng(0)
    x = gs.Variable("x", np.float32, ("N", 3, 8, 8))
    c, r, f = (gs.Variable(n, np.float32) for n in ("c", "r", "f"))
    y = gs.Variable("y", np.float32, ("N", 10))
    shape = gs.Constant("flat.shape", np.array([-1, 256], np.int64))
    nodes = [gs.Node("Conv", "conv", {"pads": [1, 1, 1, 1]}, inputs=[x, _const("conv.w", (4, 3, 3, 3), rng)],
                     outputs=[c]),
             gs.Node("Relu", "relu", inputs=[c], outputs=[r]),
             gs.Node("Reshape", "flat", inputs=[r, shape], outputs=[f]),
             gs.Node("MatMul", "fc", inputs=[f, _const("fc.w", (256, 10), rng)], outputs=[y])]
    return _finish(gs.Graph(nodes, [x], [y], name="conv_reshape_fc"))


def _save(model: onnx.ModelProto, path, threshold: int | None) -> None:
    copy = onnx.ModelProto()
    copy.CopyFrom(model)  # saving as external data rewrites the proto it is given
    if threshold is None:
        onnx.save_model(copy, str(path))
    else:
        onnx.save_model(copy, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                        location=path.name + ".data", size_threshold=threshold)


def _scales(qmodel) -> dict[tuple[str, int], tuple[float, ...]]:
    return {(r.node, r.input_index): r.scale for r in qmodel.records}


def _digests(folder) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


@pytest.fixture
def calib(rng):
    return {"x": rng.standard_normal((12, 3, 8, 8)).astype(np.float32)}


def test_a_model_with_every_tensor_external_calibrates_as_the_plain_model(tmp_path, calib):
    model = _conv_reshape_fc()
    _save(model, tmp_path / "plain.onnx", None)
    _save(model, tmp_path / "ext.onnx", 0)
    stored = onnx.load(str(tmp_path / "ext.onnx"), load_external_data=False)
    assert all(is_external(t) for t in stored.graph.initializer)  # the shape too
    before = _digests(tmp_path)
    plain = quantize(tmp_path / "plain.onnx", calib, CalibConfig("minmax"))
    ext = quantize(tmp_path / "ext.onnx", calib, CalibConfig("minmax"))
    assert _scales(ext) == _scales(plain) and len(_scales(plain)) == 4
    assert ext.calibration.ranges == plain.calibration.ranges
    assert _digests(tmp_path) == before


def test_small_external_tensors_are_read_at_load_and_large_ones_stay_in_their_file(tmp_path):
    model = _conv_reshape_fc()
    _save(model, tmp_path / "ext.onnx", 0)
    loaded = {t.name: t for t in load_model(tmp_path / "ext.onnx").graph.initializer}
    sizes = {name: tensor_array(t).nbytes for name, t in loaded.items()}
    assert sizes == {"conv.w": 432, "flat.shape": 16, "fc.w": 10240}
    assert {name for name, t in loaded.items() if is_external(t)} == {
        name for name, size in sizes.items() if size >= INLINE_BELOW} == {"fc.w"}
    plain = {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer}
    for name, tensor in loaded.items():
        np.testing.assert_array_equal(tensor_array(tensor), plain[name])


def test_a_hard_linked_data_file_is_read_like_any_other(tmp_path, calib):
    model = ms.mlp4(width=32)  # 4 KiB weights: they stay in the data file
    _save(model, tmp_path / "plain.onnx", None)
    _save(model, tmp_path / "ext.onnx", 0)
    os.link(tmp_path / "ext.onnx.data", tmp_path / "backup.data")
    assert os.stat(tmp_path / "ext.onnx.data").st_nlink == 2
    data = {"x": np.random.default_rng(1).standard_normal((9, 32)).astype(np.float32)}
    before = _digests(tmp_path)
    loaded = load_model(tmp_path / "ext.onnx")
    assert all(is_external(t) for t in loaded.graph.initializer)
    linked = quantize(tmp_path / "ext.onnx", data, CalibConfig("minmax"))
    assert _scales(linked) == _scales(quantize(tmp_path / "plain.onnx", data, CalibConfig("minmax")))
    assert _digests(tmp_path) == before


def _dim_not_utf8(tmp_path):
    raw = ms.mlp4().SerializeToString()
    assert raw.count(b"\x12\x01N") >= 1  # Dimension.dim_param (field 2) = "N"
    path = tmp_path / "m.onnx"
    path.write_bytes(raw.replace(b"\x12\x01N", b"\x12\x01\xff"))
    return path


def test_a_dimension_name_that_is_not_utf8_is_one_model_error(tmp_path):
    with pytest.raises(ModelError) as caught:
        load_model(_dim_not_utf8(tmp_path))
    assert str(caught.value) == ("Graph input 'x' names a dimension with bytes that are not UTF-8 "
                                 "(b'\\xff'); ONNX names are UTF-8 text. Rename the dimension (or re-export "
                                 "the model).")


def test_the_cli_refuses_a_dimension_name_that_is_not_utf8_in_one_line(tmp_path, capsys):
    path = _dim_not_utf8(tmp_path)
    np.savez(tmp_path / "c.npz", x=np.zeros((4, 16), np.float32))
    before = _digests(tmp_path)
    assert main(["calibrate", str(path), "--data", str(tmp_path / "c.npz"), "--out", str(tmp_path / "q.onnx"),
                 "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("quantdbg calibrate: error: Graph input 'x' names a dimension")
    assert err.count("\n") == 1
    assert _digests(tmp_path) == before
