"""Ranges one sample blows up: corrupt values beyond float16's range refused (naming the sample or the
initializer), large tensors and ranges one sample alone sets named; corrupt weights refused."""
from __future__ import annotations

import re
import warnings

import models_sensitivity as ms
import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from quantdbg.calibration import calibrate
from quantdbg.calibration.sample_peaks import check_beyond_fp16
from quantdbg.calibration.stats import SamplePeak, TensorStats
from quantdbg.config import CalibConfig
from quantdbg.errors import DataError, ModelError, QuantDbgWarning
from quantdbg.qdq import insert_qdq, quantize
from quantdbg.quant_math import FP16_MAX, QMAX, fake_quant

METHODS = ("minmax", "percentile", "entropy", "mse")


def _data(n: int = 20, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, 16)).astype(np.float32)


def _weights(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    return {init.name: numpy_helper.to_array(init) for init in model.graph.initializer}


def _with_weight(name: str, index: tuple[int, int], value: float) -> onnx.ModelProto:
    model = ms.mlp4()
    for init in model.graph.initializer:
        if init.name == name:
            values = numpy_helper.to_array(init).copy()
            values[index] = value
            init.CopyFrom(numpy_helper.from_array(values, name))
    return model


def _refused(x: np.ndarray, method: str) -> str:
    with pytest.raises(DataError) as caught:
        calibrate(ms.mlp4(), {"x": x}, CalibConfig(method))
    return str(caught.value)


def _ordinary(x: np.ndarray) -> tuple[int, float]:
    """How many values float16 can hold, and their max |x|."""
    within = np.abs(x[np.abs(x) <= FP16_MAX])
    return within.size, float(within.max())


def _corrupt(tensor: str, value: float, ordinary: tuple[int, float], where: str, fix: str) -> str:
    return (f"Tensor {tensor!r} reaches {value:.3g} during calibration{where}, beyond float16's range "
            f"(+-65504) and more than 254 times its {ordinary[0]} other values (at most {ordinary[1]:.3g}): "
            f"its INT8 scale would be {value / QMAX:.3g}, which rounds all of them to 0, and an FP16 "
            f"fallback would overflow. {fix}")


@pytest.mark.parametrize("method", METHODS)
def test_one_sample_beyond_fp16_is_refused_by_every_method(method):
    x = _data()
    x[13, 4] = 3e38
    message = _refused(x, method)
    head = _corrupt("x", float(np.float32(3e38)), _ordinary(x), ", in sample 13 alone (counted from 0)",
                    "Remove or clip sample 13, or check the preprocessing.")
    assert message.startswith(head) and re.fullmatch(r"( \d+ more tensor\(s\) hold such values too\.)?",
                                                     message[len(head):])


def test_corrupt_values_in_several_samples_are_refused_too():
    x = _data()
    x[13, 4], x[2, 0], x[19, 9] = 3e38, -1e6, 2e6
    assert _refused(x, "minmax").startswith(_corrupt(
        "x", float(np.float32(3e38)), _ordinary(x), ", in samples 13 and 19 at least (counted from 0)",
        "Remove or clip those samples, or check the preprocessing."))


def test_a_tensor_without_sample_axis_is_refused_without_a_sample():
    stats = {"t": TensorStats("t", -1e6, 5.0, 10, fp16_absmax=5.0, beyond_fp16=1)}
    with pytest.raises(DataError) as caught:
        check_beyond_fp16(stats, ms.mlp4())
    assert str(caught.value) == _corrupt("t", 1e6, (9, 5.0), " (its values cannot be told apart by sample)",
                                         "Remove or clip those samples, or check the preprocessing.")


def test_a_tensor_merely_beyond_fp16_is_named_and_quantizes_like_the_same_data_scaled_down():
    x = _data()
    big = x * np.float32(1e5)  # most values beyond float16's range, the rest spread below it
    with pytest.warns(QuantDbgWarning) as caught:
        result = calibrate(ms.mlp4(), {"x": big}, CalibConfig("minmax"))
    top = int(np.abs(big).max(axis=1).argmax())
    assert (f"Tensor 'x' reaches {np.abs(big).max():.3g} during calibration (the most in sample {top}), "
            "beyond float16's range (+-65504): INT8 holds it, but the layers reading it would overflow in "
            "FP16; keep them in FP32 if they leave INT8.") in [str(w.message) for w in caught]
    plain = calibrate(ms.mlp4(), {"x": x}, CalibConfig("minmax"))
    for name, scale in plain.scales().items():  # the model is linear then ReLU: ranges scale with x
        assert result.scales()[name] == pytest.approx(scale * 1e5, rel=1e-5)


@pytest.mark.parametrize(("value", "held"), [(3e38, "3e+38, beyond float16's range"),
                                             (np.nan, "1 NaN/Inf value(s)")], ids=["3e38", "nan"])
def test_a_corrupt_weight_is_named(value, held):
    model = _with_weight("fc1.w", (2, 3), value)
    with pytest.raises(ModelError, match=f"'fc1.w' of node 'fc1' holds {re.escape(held)}"):
        quantize(model, {"x": _data()}, CalibConfig("minmax"))


def test_insert_qdq_refuses_a_weight_that_dwarfs_its_channel_unless_its_node_stays_fp32():
    calibration = calibrate(ms.mlp4(), {"x": _data()}, CalibConfig("minmax"))
    model = _with_weight("fc3.w", (0, 0), 1e5)
    rest = float(np.abs(_weights(model)["fc3.w"][1:, 0]).max())  # MatMul weights: channels on axis 1
    with pytest.raises(ModelError) as caught:
        insert_qdq(model, calibration)
    assert str(caught.value) == (
        f"Weight 'fc3.w' of node 'fc3' holds 1e+05, beyond float16's range and more than 254 times the "
        f"rest of its channel (at most {rest:.3g}), which its INT8 scale would round to 0. Fix the model's "
        "weights (re-export it) before quantizing.")
    assert "fc3" not in insert_qdq(model, calibration, exclude=["fc3"]).layers
    scaled = ms.mlp4()  # large but of one scale: INT8 holds it
    for init in scaled.graph.initializer:
        init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init) * np.float32(1e6), init.name))
    assert len(insert_qdq(scaled, calibration).layers) == 4


def _one_sample_warnings(x: np.ndarray, method: str) -> tuple[list[str], object]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = calibrate(ms.mlp4(), {"x": x}, CalibConfig(method))
    return [str(w.message) for w in caught if w.category is QuantDbgWarning
            and str(w.message).startswith("Tensor 'x': sample")], result


def _spread(factor: float) -> np.ndarray:
    """Samples within +-1 (sample 0 reaches 1.0) but sample 7, which reaches ``factor``."""
    x = np.clip(_data(16) * 0.3, -0.9, 0.9)
    x[0, 0], x[7] = 1.0, x[7] / 0.9 * factor
    x[7, 3] = factor
    return x


def test_a_range_one_sample_alone_sets_is_named_when_it_zeroes_every_other_sample():
    x = _spread(300.0)
    found, result = _one_sample_warnings(x, "minmax")
    assert found == ["Tensor 'x': sample 7 alone sets its range (300, minmax); every other sample stays "
                     "within 1, below 1/254 of it, so all of their values quantize to 0. Remove or clip "
                     "sample 7, check the preprocessing, or choose a calibrator that clips outliers "
                     "(percentile, entropy, mse)."]
    others = np.delete(x, 7, axis=0)
    assert not fake_quant(others, result.ranges["x"].scale).any()  # what the warning claims
    assert result.stats["x"].peaks == (SamplePeak(7, 300.0), SamplePeak(0, 1.0))


def test_a_wide_range_that_keeps_other_samples_alive_is_not_named():
    x = _spread(200.0)  # 1.0 / (200 / 127) = 0.635 rounds to 1: sample 0 survives
    found, result = _one_sample_warnings(x, "minmax")
    assert found == [] and fake_quant(np.delete(x, 7, axis=0), result.ranges["x"].scale).any()
