"""TrtRunner against a real TensorRT: engine build, outputs vs ONNX Runtime, profiles, inspector.

These tests need the TensorRT Python bindings (10.x/11.x), cuda-python and an NVIDIA GPU; they skip
with the reason everywhere else (see conftest.py). They use no mock of TensorRT.
"""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("tensorrt", reason="TensorRT is not installed: its wheels come from NVIDIA's index "
                                       "and need an NVIDIA GPU; these tests run only where it imports")

import models_lint  # noqa: E402

from quantdbg.backends import available, make_runner_factory  # noqa: E402
from quantdbg.backends.tensorrt import TrtConfig, TrtRunner, build_engine  # noqa: E402
from quantdbg.errors import BackendError, DataError  # noqa: E402

pytestmark = [pytest.mark.trt, pytest.mark.gpu, pytest.mark.usefixtures("trt_ready")]


def _feed(rng: np.random.Generator, batch: int) -> dict[str, np.ndarray]:
    return {"x": rng.standard_normal((batch, 16, 8, 8)).astype(np.float32)}


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.ravel().astype(np.float64), b.ravel().astype(np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def _layers_of(layers, node: str):
    return [layer for layer in layers if node in layer.onnx_nodes or node in layer.name]


def test_backend_is_listed_and_its_factory_makes_trt_runners():
    assert available() == ["onnxrt", "tensorrt"]
    config = TrtConfig(batch=(1, 2, 4))
    runner = make_runner_factory("tensorrt", config)(models_lint.clean_conv_block())
    assert isinstance(runner, TrtRunner) and runner.config is config and not runner.is_active


def test_int8_engine_matches_onnxruntime(rng, ort_outputs):
    model = models_lint.clean_conv_block()
    feed = _feed(rng, 4)
    with TrtRunner(model, TrtConfig(batch=(1, 4, 8))) as runner:
        got = runner.infer(feed)["y"]
    want = ort_outputs(model, feed)["y"]
    assert got.shape == want.shape == (4, 16)
    # Same Q/DQ semantics, different kernels: INT8 accumulation vs float accumulation can move an
    # intermediate value across a rounding boundary, so outputs agree closely, not bitwise.
    assert _cosine(got, want) > 0.999
    np.testing.assert_allclose(got, want, atol=0.05 * float(np.abs(want).max()))


def test_dynamic_batch_profile_covers_min_to_max_and_refuses_beyond(rng, ort_outputs):
    model = models_lint.clean_conv_block()
    with TrtRunner(model, TrtConfig(batch=(1, 2, 4))) as runner:
        for batch in (1, 4, 2):
            feed = _feed(rng, batch)
            got = runner.infer(feed)["y"]
            assert got.shape == (batch, 16)
            assert _cosine(got, ort_outputs(model, feed)["y"]) > 0.999
        with pytest.raises(BackendError, match=r"Input 'x' has shape \(8, 16, 8, 8\), outside the engine's "
                                               r"optimization profile"):
            runner.infer(_feed(rng, 8))


def test_inspector_reports_int8_and_fp16_fallback_layers():
    with TrtRunner(models_lint.int8_conv_then_fp16_conv(), TrtConfig(batch=(1, 2, 4))) as runner:
        layers = runner.layer_precisions()  # before any infer: the runner sets the opt shapes itself
    int8 = _layers_of(layers, "conv_int8")
    fp16 = _layers_of(layers, "conv_fp16")
    assert int8 and all(layer.precision == "INT8" for layer in int8), layers
    assert fp16 and all(layer.precision == "FP16" for layer in fp16), layers
    assert all(layer.tactic for layer in int8 + fp16)


def test_engine_save_then_load_gives_identical_outputs(rng, tmp_path):
    model, feed = models_lint.clean_conv_block(), _feed(rng, 2)
    plan = tmp_path / "engine.plan"
    with TrtRunner(model, TrtConfig(batch=(1, 2, 4), save_engine=plan)) as runner:
        first = runner.infer(feed)["y"]
    assert plan.stat().st_size > 0
    with TrtRunner(model, TrtConfig(batch=(1, 2, 4), load_engine=plan)) as runner:
        np.testing.assert_array_equal(runner.infer(feed)["y"], first)


def _timing_entries(path) -> dict[str, tuple[int, float]]:
    """Key -> (tactic hash, measured time) of every entry of a timing-cache file, read by TensorRT."""
    import tensorrt as trt

    builder = trt.Builder(trt.Logger(trt.Logger.ERROR))
    cache = builder.create_builder_config().create_timing_cache(path.read_bytes())
    return {str(key): (int(value.tacticHash), float(value.timingMSec))
            for key in cache.queryKeys() for value in (cache.query(key),)}


def test_timing_cache_is_written_and_reused(tmp_path):
    cache = tmp_path / "timing.cache"
    config = TrtConfig(batch=(1, 1, 2), timing_cache=cache)
    assert build_engine(models_lint.clean_conv_block(), config)
    first_bytes = cache.read_bytes()
    first = _timing_entries(cache)
    assert first, "the first build timed no tactic into the cache"
    assert build_engine(models_lint.clean_conv_block(), config)  # loads the cache it wrote
    second_bytes = cache.read_bytes()
    second = _timing_entries(cache)
    assert len(second_bytes) >= len(first_bytes)
    # A build that reads the cache takes each cached tactic without timing it again, so every entry
    # comes back with the very time measured by the first build. A build that ignored the file would
    # time every tactic afresh and write new measurements (GPU timings never repeat to the last bit).
    assert {key: second.get(key) for key in first} == first


def test_parser_errors_name_the_node():
    with pytest.raises(BackendError, match=r"ONNX parser rejected the model:\n  node 'matmul_integer'"):
        build_engine(models_lint.integer_matmul())


def test_latency_is_timed_with_cuda_events(rng):
    with TrtRunner(models_lint.clean_conv_block(), TrtConfig(batch=(1, 2, 4))) as runner:
        result = runner.measure_latency(_feed(rng, 2), iterations=5, warmup=2)
    assert len(result.times_ms) == 5 and all(t > 0 for t in result.times_ms)
    assert min(result.times_ms) <= result.median_ms <= max(result.times_ms)
    assert result.input_shapes == {"x": (2, 16, 8, 8)}


def test_output_selection_and_feed_checks(rng):
    with TrtRunner(models_lint.clean_conv_block(), TrtConfig(batch=(1, 2, 4))) as runner:
        assert list(runner.infer(_feed(rng, 1), outputs=["y"])) == ["y"]
        with pytest.raises(DataError, match="No output named 'z'"):
            runner.infer(_feed(rng, 1), outputs=["z"])
        with pytest.raises(DataError, match="expects dtype float32"):
            runner.infer({"x": np.zeros((1, 16, 8, 8), np.float64)})
