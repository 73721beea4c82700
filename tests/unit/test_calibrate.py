"""calibrate(): calibrator choice per op/tensor, shared scales, warnings, errors, JSON round trip."""
from __future__ import annotations

import json
import warnings
from types import MappingProxyType

import models
import numpy as np
import onnxruntime as ort
import pytest

from quantdbg.calibration import CalibrationResult, EntropyConfig, PercentileConfig, calibrate
from quantdbg.calibration.calibrators.base import get_calibrator
from quantdbg.calibration.stats import merge_stats
from quantdbg.config import CalibConfig, QuantConfig
from quantdbg.data import ArrayData
from quantdbg.errors import ConfigError, ModelError, QuantDbgWarning
from quantdbg.placement import QdqPlan, QuantTarget, plan_qdq


def _opts() -> ort.SessionOptions:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    return options


def _data(rng, shape, n=24, batch=5) -> ArrayData:
    return ArrayData({"x": rng.standard_normal((n, *shape)).astype(np.float32)}, batch_size=batch)


def test_calibrator_chosen_per_tensor_then_per_op_then_default(rng):
    model = models.conv_residual()
    plan = plan_qdq(model)
    assert set(plan.activation_tensors) == {"x", "r1"}  # x feeds conv1 and the residual Add
    config = CalibConfig(method="minmax", per_op={"Add": "mse", "Conv": "entropy"},
                         per_tensor={"r*": PercentileConfig(99.9)})
    result = calibrate(model, _data(rng, (4, 8, 8)), config, session_options=_opts())
    assert {n: r.method for n, r in result.ranges.items()} == {"x": "entropy", "r1": "percentile"}
    for name, r in result.ranges.items():  # each range is its calibrator applied to its stats
        spec = config.method_for(name, plan.consumer_ops(name))
        assert r == get_calibrator(spec).compute(result.stats[name])
    assert (result.n_batches, result.n_samples) == (5, 24)


def test_histograms_only_where_needed(rng):
    model = models.conv_residual()
    data = _data(rng, (4, 8, 8))
    only_minmax = calibrate(model, data, CalibConfig(method="minmax"), session_options=_opts())
    assert all(s.hist is None for s in only_minmax.stats.values())
    assert only_minmax.ranges["x"].amax == np.abs(data.arrays["x"]).max()  # NumPy oracle
    assert only_minmax.stats["x"].count == data.arrays["x"].size
    mixed = calibrate(model, data, CalibConfig(method="minmax", per_tensor={"r1": "entropy"}),
                      session_options=_opts())
    assert mixed.stats["r1"].hist is not None and mixed.stats["x"].hist is None


def test_concat_inputs_share_the_range_of_their_merged_values(rng):
    model = models.concat_convs()
    plan = plan_qdq(model)
    assert plan.shared_scale_groups
    result = calibrate(model, _data(rng, (3, 8, 8)), CalibConfig(method="entropy"), plan,
                       session_options=_opts())
    for group in plan.shared_scale_groups:
        merged = get_calibrator("entropy").compute(merge_stats("g", [result.stats[n] for n in group]))
        assert {result.ranges[n].amax for n in group} == {merged.amax}
        minmax = calibrate(model, _data(rng, (3, 8, 8)), CalibConfig(method="minmax"), plan,
                           session_options=_opts())
        assert {minmax.ranges[n].amax for n in group} == {max(minmax.stats[n].absmax for n in group)}


def test_result_json_round_trip(rng):
    config = CalibConfig(method=EntropyConfig(start_bin=256), per_op={"Conv": "mse"},
                         per_tensor={"r*": PercentileConfig(99.5), "*": "minmax"}, num_bins=512)
    result = calibrate(models.conv_residual(), _data(rng, (4, 8, 8)), config, session_options=_opts())
    again = CalibrationResult.from_dict(json.loads(json.dumps(result.to_dict())))
    assert again == result
    assert list(again.config.per_tensor) == ["r*", "*"]  # glob order decides, so it must survive
    assert isinstance(again.ranges, MappingProxyType) and isinstance(again.stats, MappingProxyType)
    assert set(result.to_dict()) == {"format", "ranges", "stats", "config", "n_batches", "n_samples",
                                     "folded_weights", "footprint"}
    assert result.to_dict()["format"] == "quantdbg.calibration/1"
    assert again.footprint == result.footprint  # left out of ==: it is this run's memory
    assert result.to_dict()["ranges"]["r1"] == {"name": "r1", "lo": result.ranges["r1"].lo,
                                                "hi": result.ranges["r1"].hi, "method": "percentile"}


@pytest.mark.parametrize(("glob", "message"), [
    ("r_1", "CalibConfig.per_tensor entry 'r_1' matches no tensor. No tensor named 'r_1' in the model. "
            "Did you mean 'r1'?"),
    ("*/head/*", "CalibConfig.per_tensor entry '*/head/*' matches no tensor. No tensor named '*/head/*' in "
                 "the model; the closest are 'x', 'c1', 'r1' (6 in all)."),
])
def test_a_per_tensor_glob_matching_nothing_fails_before_reading_data(glob, message):
    class Untouchable:
        def __iter__(self):
            raise AssertionError("data was read")

    with pytest.raises(ModelError) as err:
        calibrate(models.conv_residual(), Untouchable(), CalibConfig(per_tensor={"x": "mse", glob: "mse"}))
    assert str(err.value) == message


def test_unknown_calibrator_fails_before_reading_data():
    class Untouchable:
        def __iter__(self):
            raise AssertionError("data was read")

    with pytest.raises(ConfigError, match=r"No calibrator named 'percentil'\. Did you mean 'percentile'\?"):
        calibrate(models.conv_relu(), Untouchable(), CalibConfig(per_op={"Conv": "percentil"}))


def test_plan_without_activations_is_refused(rng):
    with pytest.raises(ConfigError, match="no activation tensor.*the QuantConfig the plan was made"):
        calibrate(models.conv_relu(), _data(rng, (3, 8, 8)), CalibConfig(), QdqPlan(()))
    with pytest.raises(ConfigError, match=r"Check QuantConfig.op_types \('Gemm',\) and exclude \(\)"):
        calibrate(models.conv_relu(), _data(rng, (3, 8, 8)), CalibConfig(), QuantConfig(op_types=("Gemm",)))


def test_nonfinite_and_all_zero_tensors_are_warned(rng):
    model = models.log_matmul()
    plan = QdqPlan((QuantTarget("fc", "MatMul", 0, "l", "activation"),))
    x = np.ones((2, 4), np.float32)
    x[0, 0] = 0.0  # Log: zeros everywhere but one -inf
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = calibrate(model, [{"x": x}], CalibConfig(method="entropy"), plan,
                           session_options=_opts())
    messages = [str(w.message) for w in caught if w.category is QuantDbgWarning]
    assert any(m.startswith("Tensor 'l': 1 NaN/Inf value(s) out of 8") for m in messages)
    assert any(m.startswith("Tensor 'l' had only zeros during calibration") for m in messages)
    assert result.ranges["l"].amax == 1.0 and result.stats["l"].nonfinite == 1


def test_calibrate_leaves_the_model_untouched(rng):
    model = models.concat_convs()
    before = model.SerializeToString()
    calibrate(model, _data(rng, (3, 8, 8)), CalibConfig(method="minmax"), QuantConfig(),
              session_options=_opts())
    assert model.SerializeToString() == before


def test_a_loaded_model_is_not_checked_again(rng, monkeypatch):
    import onnx

    from quantdbg.model.load import as_loaded

    data = _data(rng, (4, 8, 8))
    config = CalibConfig(method="mse")
    expected = calibrate(models.conv_residual(), data, config, session_options=_opts())
    loaded = as_loaded(models.conv_residual())

    def refuse(*args, **kwargs):
        raise AssertionError("the checker ran again on a loaded model")

    monkeypatch.setattr(onnx.checker, "check_model", refuse)
    assert calibrate(loaded, data, config, session_options=_opts()) == expected
    with pytest.raises(AssertionError, match="the checker ran again"):
        calibrate(models.conv_residual(), data, config, session_options=_opts())
