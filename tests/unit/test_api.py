"""The one-call path (quantdbg.api.quantize) and saving its result."""
from __future__ import annotations

import models
import numpy as np
import onnx
import pytest
from onnx import numpy_helper

import quantdbg
from quantdbg.config import CalibConfig, QuantConfig, TensorKind
from quantdbg.errors import DataError, ModelError
from quantdbg.placement import plan_qdq
from quantdbg.qdq import QuantizedModel, quantize, records_from_model


def mlp_activations(model: onnx.ModelProto, x: np.ndarray) -> dict[str, np.ndarray]:
    """The two activations the MLP's Q/DQ plan quantizes, computed in NumPy."""
    w = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    return {"x": x, "r": np.maximum(x @ w["fc1.w"].T + w["fc1.b"], 0)}


def test_minmax_scales_equal_numpy_absmax_over_all_samples(rng):
    model = models.mlp()
    x = (rng.standard_normal((40, 8)) * 2).astype(np.float32)
    qm = quantize(model, {"x": x}, CalibConfig(method="minmax"), batch_size=7)
    expected = {name: float(np.abs(a).max()) / 127 for name, a in mlp_activations(model, x).items()}
    for record in qm.records:
        if record.kind is TensorKind.ACTIVATION:
            assert record.scale[0] == pytest.approx(expected[record.tensor], rel=1e-6)
            assert record.calibrator == "minmax"
    assert qm.calibration is not None and qm.calibration.n_samples == 40
    assert qm.calibration.n_batches == 6  # ceil(40 / 7)


def test_records_follow_the_plan_and_the_quant_config(rng):
    model = models.conv_residual()
    x = rng.standard_normal((8, 4, 8, 8)).astype(np.float32)
    quant = QuantConfig(exclude=("conv2",))
    qm = quantize(model, {"x": x}, CalibConfig(method="minmax"), quant)
    plan = plan_qdq(model, quant)
    assert [(r.node, r.input_index, r.tensor, r.kind) for r in qm.records] == \
        [(t.node, t.input_index, t.tensor, t.kind) for t in plan.targets]


def test_batch_size_does_not_change_the_result(rng):
    model = models.conv_residual()
    x = rng.standard_normal((24, 4, 8, 8)).astype(np.float32)
    results = [quantize(model, {"x": x}, CalibConfig(method="entropy"), batch_size=b).records
               for b in (1, 7, 24)]
    for other in results[1:]:
        for a, b in zip(results[0], other, strict=True):
            assert a.tensor == b.tensor
            np.testing.assert_allclose(a.scale, b.scale, rtol=1e-6)


def test_npz_path_with_extra_arrays(rng, tmp_path):
    model = models.mlp()
    path = tmp_path / "calib.npz"
    x = rng.standard_normal((10, 8)).astype(np.float32)
    np.savez(path, x=x, label=np.arange(10))  # labels beside the inputs are ignored
    qm = quantize(model, path, CalibConfig(method="minmax"))
    assert qm.calibration.n_samples == 10


def test_input_untouched_and_save_round_trip(rng, tmp_path):
    model = models.mlp()
    before = model.SerializeToString()
    qm = quantize(model, {"x": rng.standard_normal((4, 8)).astype(np.float32)}, CalibConfig(method="minmax"))
    assert model.SerializeToString() == before
    path = qm.save(tmp_path / "int8.onnx")
    assert path == tmp_path / "int8.onnx"
    assert onnx.load(path).SerializeToString() == qm.model.SerializeToString()
    again = records_from_model(path)
    assert [(r.node, r.input_index, r.scale) for r in again.records] == \
        [(r.node, r.input_index, r.scale) for r in qm.records]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["int8.onnx"]  # no temporary left behind
    with pytest.raises(ModelError, match=r"folder .* does not exist"):
        qm.save(tmp_path / "missing" / "int8.onnx")


def test_bad_batch_size_and_quantized_input(rng):
    model = models.mlp()
    x = {"x": rng.standard_normal((4, 8)).astype(np.float32)}
    with pytest.raises(DataError) as err:
        quantize(model, x, batch_size=0)
    assert str(err.value) == "batch_size must be >= 1, got 0."
    qm = quantize(model, x, CalibConfig(method="minmax"))
    with pytest.raises(ModelError, match=r"^The model is already quantized"):
        quantize(qm.model, x)


def test_public_names_are_the_packages_own_objects():
    from quantdbg import calibration, config, placement, qdq

    expected = {
        "quantize": quantize, "QuantizedModel": QuantizedModel, "plan_qdq": placement.plan_qdq,
        "insert_qdq": qdq.insert_qdq, "remove_qdq": qdq.remove_qdq, "records_from_model": records_from_model,
        "write_trt_cache": qdq.write_trt_cache, "read_trt_cache": qdq.read_trt_cache,
        "calibrate": calibration.calibrate, "CalibrationResult": calibration.CalibrationResult,
        "register_calibrator": calibration.register_calibrator,
        "CalibConfig": config.CalibConfig, "QuantConfig": config.QuantConfig, "Precision": config.Precision,
    }
    for name, obj in expected.items():
        assert name in quantdbg.__all__ and getattr(quantdbg, name) is obj, name
    # The step-by-step pieces stay in their packages, not at the top level.
    for name in ("QdqPlan", "QdqRecord", "collect_stats", "TensorStats", "OnnxrtRunner", "write_scales_json"):
        assert name not in quantdbg.__all__ and not hasattr(quantdbg, name), name
