"""Sharded calibration on Ray: the same scales, Q/DQ model bytes and TensorRT cache as one process."""
from __future__ import annotations

import models
import models_large
import numpy as np
import pytest

pytest.importorskip("ray")

from quantdbg.calibration import CollectConfig, collect_stats  # noqa: E402
from quantdbg.config import CalibConfig  # noqa: E402
from quantdbg.data import ArrayData, FeedList  # noqa: E402
from quantdbg.errors import ConfigError, DataError  # noqa: E402
from quantdbg.execution import RayExecutor  # noqa: E402
from quantdbg.qdq import quantize, write_scales_json, write_trt_cache  # noqa: E402

METHODS = ("minmax", "entropy", "percentile", "mse")
BATCH = 8
SAMPLES = 84  # 11 feeds, the last of 4 samples: 2 shards hold 6 + 5 feeds, 3 shards 4 + 4 + 3


@pytest.fixture(scope="module")
def case():
    """A model with a shared-scale Concat and heavy-tailed data (outliers make the histograms matter)."""
    rng = np.random.default_rng(7)
    x = rng.standard_t(3, size=(SAMPLES, 3, 8, 8)).astype(np.float32)
    return models.concat_convs(), {"x": x}


def _outputs(qmodel, folder) -> tuple[bytes, bytes, bytes]:
    cache, scales = folder / "model.cache", folder / "scales.json"
    write_trt_cache(qmodel, cache)
    write_scales_json(qmodel, scales)
    return qmodel.model.SerializeToString(), cache.read_bytes(), scales.read_bytes()


@pytest.mark.parametrize("method", METHODS)
def test_sharded_calibration_is_byte_identical(ray_instance, case, method, tmp_path):
    model, data = case
    serial_dir = tmp_path / "serial"
    serial_dir.mkdir()
    serial = quantize(model, data, CalibConfig(method=method), batch_size=BATCH)
    expected = _outputs(serial, serial_dir)
    for shards in (1, 2, 3):
        folder = tmp_path / f"shards{shards}"
        folder.mkdir()
        calib = CalibConfig(method=method, executor=RayExecutor(), shards=shards)
        sharded = quantize(model, data, calib, batch_size=BATCH)
        assert _outputs(sharded, folder) == expected, f"{method} with {shards} shard(s)"
        assert sharded.calibration.stats == serial.calibration.stats
        assert (sharded.calibration.n_batches, sharded.calibration.n_samples) == (11, SAMPLES)


def test_feed_lists_shard_into_the_same_statistics(ray_instance, case):
    model, data = case
    feeds = FeedList(ArrayData(data, BATCH))
    names = ["x", "a", "b"]
    serial = collect_stats(model, feeds, names, CollectConfig(histogram=True, max_batches=9))
    sharded = collect_stats(model, feeds, names, CollectConfig(histogram=True, max_batches=9,
                                                               executor=RayExecutor(), shards=2))
    assert dict(sharded) == dict(serial)
    assert (sharded.n_batches, sharded.n_samples) == (serial.n_batches, serial.n_samples) == (9, 72)
    assert serial["x"].max == float(data["x"][:72].max())  # the oracle: NumPy over the first 9 feeds


def test_unsplittable_data_is_refused(ray_instance, case):
    model, data = case
    feeds = (feed for feed in ArrayData(data, BATCH))  # a one-shot generator becomes a FeedList: fine
    collect_stats(model, feeds, ["a"], CollectConfig(executor=RayExecutor(), shards=2))

    class Stream:
        def __iter__(self):
            return iter(ArrayData(data, BATCH))

    with pytest.raises(ConfigError, match=r"^Data of type Stream cannot be cut into shards; pass an \.npz "
                                          r"path, arrays or a list of feeds"):
        collect_stats(model, Stream(), ["a"], CollectConfig(executor=RayExecutor(), shards=2))


def test_a_bad_feed_is_named_by_its_shard_and_place(ray_instance, case):
    model, data = case
    feeds = [dict(feed) for feed in ArrayData(data, BATCH)]
    feeds[7] = {"x": feeds[7]["x"].astype(np.float64)}
    with pytest.raises(DataError, match=r"Calibration shard 2 of 2 \(batches 6 to 10 of the data\): "
                                        r"calibration batch 1: input 'x' expects dtype float32, got float64"):
        collect_stats(model, feeds, ["a"], CollectConfig(executor=RayExecutor(), shards=2))


def test_on_one_node_a_lazy_models_data_file_is_read_in_place_not_shipped(ray_instance, tmp_path):
    path = models_large.matmul_stack(tmp_path, 2**20, width=64)  # 1 MiB of weights in model.onnx.data
    size = path.with_name("model.onnx.data").stat().st_size
    data = {"x": models_large.inputs(64, 4 * BATCH)}
    serial = quantize(path, data, CalibConfig(method="minmax"), batch_size=BATCH)
    executor = RayExecutor()
    calib = CalibConfig(method="minmax", executor=executor, shards=2)
    sharded = quantize(path, data, calib, batch_size=BATCH)
    assert sharded.model.SerializeToString() == serial.model.SerializeToString()
    (shipped,) = executor.shipments
    assert (shipped.tasks, shipped.files, shipped.new_files) == (2, 0, 0)  # every worker is on this node
    # The shared object holds the data and the graph; the weights stay in the driver's data file, which
    # the workers read in place. A task carries its shard's index and the references only.
    assert data["x"].nbytes < shipped.shared < data["x"].nbytes + size // 8
    assert shipped.per_task < 1000
