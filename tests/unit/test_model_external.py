"""External weights: read on demand, saved beside the model past a threshold, staged for ONNX Runtime."""
from __future__ import annotations

import models_large
import numpy as np
import onnx
import onnxruntime as ort
import pytest

from quantdbg.errors import ConfigError, ModelError
from quantdbg.model import SaveConfig, load_model, save_model
from quantdbg.model import staging as staging_module
from quantdbg.model.external import fits_in_protobuf, model_bytes, tensor_array
from quantdbg.model.staging import staged

WIDTH = 32


@pytest.fixture
def stack(tmp_path):
    folder = tmp_path / "in"
    folder.mkdir()
    return models_large.matmul_stack(folder, 3 * WIDTH * WIDTH * 4, WIDTH)


def _oracle(path, x):
    """The stack's output in NumPy, from the weights read straight out of the data file."""
    raw = np.fromfile(path.with_name(path.name + ".data"), np.float32).reshape(-1, WIDTH, WIDTH)
    for i, w in enumerate(raw):
        x = x @ w
        x = np.maximum(x, 0) if i < len(raw) - 1 else x
    return x


def test_external_weights_are_read_from_the_data_file_on_demand(stack):
    loaded = load_model(stack)
    raw = np.fromfile(stack.with_name("model.onnx.data"), np.float32).reshape(-1, WIDTH, WIDTH)
    for i, init in enumerate(loaded.graph.initializer):
        assert init.data_location == onnx.TensorProto.EXTERNAL and not init.raw_data
        np.testing.assert_array_equal(tensor_array(init), raw[i])


def test_a_missing_data_file_is_one_model_error_naming_the_model(stack):
    stack.with_name("model.onnx.data").unlink()
    with pytest.raises(ModelError, match=r"Cannot load the external weights of '.*model\.onnx'"):
        load_model(stack)


def test_a_truncated_data_file_is_refused_at_load(stack):
    data = stack.with_name("model.onnx.data")
    data.write_bytes(data.read_bytes()[:-4])
    with pytest.raises(ModelError, match=r"tensor 'w2' needs bytes up to 12288 .* which holds 12284"):
        load_model(stack)


@pytest.mark.parametrize("spill", [False, True])
def test_staged_sessions_compute_what_numpy_does(stack, monkeypatch, spill):
    if spill:  # as for a sensitivity graph holding large fake-quantized weights in memory
        monkeypatch.setattr(staging_module, "SPILL_BYTES", 0)
    loaded = load_model(stack)
    x = models_large.inputs(WIDTH, 4)
    with staged(loaded) as stage:
        assert isinstance(stage.source, str if spill else bytes)
        session = ort.InferenceSession(stage.source, stage.configure(ort.SessionOptions()),
                                       providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(session.run(None, {"x": x})[0], _oracle(stack, x), rtol=1e-5, atol=1e-5)


def test_a_lazy_model_is_saved_with_a_data_file_that_loads_back(stack, tmp_path):
    out = save_model(load_model(stack), tmp_path / "out.onnx")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in", "out.onnx", "out.onnx.data"]
    onnx.checker.check_model(str(out))
    again = onnx.load(str(out))
    raw = np.fromfile(stack.with_name("model.onnx.data"), np.float32).reshape(-1, WIDTH, WIDTH)
    for i, init in enumerate(again.graph.initializer):
        np.testing.assert_array_equal(onnx.numpy_helper.to_array(init), raw[i])
    stored = onnx.load(str(out), load_external_data=False)
    offsets = [int(e.value) for init in stored.graph.initializer for e in init.external_data
               if e.key == "offset"]
    assert offsets and all(offset % 4096 == 0 for offset in offsets)  # page-aligned: ORT can map them


def test_a_model_over_the_lowered_threshold_writes_external_data(stack, tmp_path):
    inline = onnx.load(str(stack))  # 12 kB of weights in memory
    before = inline.SerializeToString()
    save_model(inline, tmp_path / "small.onnx")
    save_model(inline, tmp_path / "big.onnx", SaveConfig(threshold_bytes=10_000, location="weights.bin"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["big.onnx", "in", "small.onnx", "weights.bin"]
    assert (tmp_path / "weights.bin").stat().st_size >= 3 * WIDTH * WIDTH * 4
    for name in ("small.onnx", "big.onnx"):
        onnx.checker.check_model(str(tmp_path / name))
        for mine, theirs in zip(inline.graph.initializer, onnx.load(str(tmp_path / name)).graph.initializer,
                                strict=True):
            np.testing.assert_array_equal(tensor_array(mine), onnx.numpy_helper.to_array(theirs))
    assert inline.SerializeToString() == before  # the caller's model is untouched


@pytest.mark.parametrize("location", ["../w.bin", "/tmp/w.bin", "sub/w.bin", "..", ""])
def test_a_data_file_outside_the_model_folder_is_refused(location):
    with pytest.raises(ConfigError, match=r"must be a plain file name in the model's folder"):
        SaveConfig(location=location)


def test_saving_without_external_data_past_2_gb_is_one_model_error(tmp_path):
    # Declared 2 GiB, none of it present: the size check reads the dims, never serialises the message.
    huge = onnx.TensorProto(name="w", data_type=onnx.TensorProto.FLOAT, dims=[2**29])
    model = onnx.helper.make_model(onnx.helper.make_graph([], "g", [], [], [huge]))
    assert not fits_in_protobuf(model)
    with pytest.raises(ModelError, match=r"exceeds protobuf's 2 GB limit and cannot be saved as one file"):
        save_model(model, tmp_path / "m.onnx", SaveConfig(external_data=False))
    assert list(tmp_path.iterdir()) == []


def test_a_lazy_model_s_identity_follows_its_weights_not_only_its_graph(stack):
    before = b"".join(model_bytes(load_model(stack)))
    data = stack.with_name("model.onnx.data")
    raw = bytearray(data.read_bytes())
    raw[100] ^= 0xFF  # one weight changes; the graph and every offset stay the same
    data.write_bytes(bytes(raw))
    assert b"".join(model_bytes(load_model(stack))) != before
