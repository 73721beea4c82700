"""calibration.recalibrate: another calibrator choice from the statistics a calibration holds gives
exactly what a new calibration pass gives, shared scales included; missing statistics are named."""
from __future__ import annotations

import models
import numpy as np
import pytest

from quantdbg.calibration import calibrate
from quantdbg.calibration.ranges import recalibrate
from quantdbg.config import CalibConfig
from quantdbg.errors import NotCalibratedError
from quantdbg.placement import plan_qdq


@pytest.mark.parametrize("config", [
    CalibConfig("minmax"),
    CalibConfig("entropy", per_tensor={"r": "mse"}),
    CalibConfig("percentile", per_op={"Gemm": "minmax"}),
])
def test_recalibrating_equals_a_new_pass(rng, config):
    model = models.mlp()
    data = {"x": rng.standard_normal((40, 8)).astype(np.float32)}
    plan = plan_qdq(model)
    first = calibrate(model, data, CalibConfig("entropy"), plan)  # entropy keeps every histogram
    found = recalibrate(first, config, plan)
    fresh = calibrate(model, data, config, plan)
    assert found.ranges == fresh.ranges and found.config == config
    assert found.stats == first.stats and (found.n_batches, found.n_samples) == (first.n_batches, 40)


def test_shared_scales_are_recomputed_from_merged_statistics(rng):
    model = models.concat_convs()
    data = {"x": rng.standard_normal((16, 3, 8, 8)).astype(np.float32)}
    plan = plan_qdq(model)
    assert plan.shared_scale_groups
    config = CalibConfig("entropy", per_tensor={"a": "minmax"})
    found = recalibrate(calibrate(model, data, CalibConfig("percentile"), plan), config, plan)
    assert found.ranges == calibrate(model, data, config, plan).ranges
    group = plan.shared_scale_groups[0]
    assert len({found.ranges[name].amax for name in group}) == 1


def test_missing_statistics_are_named(rng):
    model = models.mlp()
    data = {"x": rng.standard_normal((8, 8)).astype(np.float32)}
    plan = plan_qdq(model)
    minmax = calibrate(model, data, CalibConfig("minmax"), plan)  # min/max only, no histograms
    with pytest.raises(NotCalibratedError) as err:
        recalibrate(minmax, CalibConfig("entropy"), plan)
    assert str(err.value) == ("Tensor 'x' has no histogram in the calibration, which its calibrator "
                              "'entropy' "
                              "needs; calibrate again with calibrate().")
    other = plan_qdq(models.conv_relu())
    with pytest.raises(NotCalibratedError, match="^Tensor 'x' has no statistics"):
        recalibrate(type(minmax)({}, {}), CalibConfig("minmax"), other)
