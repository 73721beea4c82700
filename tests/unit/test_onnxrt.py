"""ONNX Runtime runner, its config, and the backend registry (quantdbg.backends)."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import models
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from numpy.lib.stride_tricks import sliding_window_view
from onnx import TensorProto, helper, numpy_helper

from quantdbg.backends import (
    OnnxrtRunner,
    OnnxrtRunnerFactory,
    OrtConfig,
    Runner,
    available,
    make_runner_factory,
)
from quantdbg.errors import BackendError, ConfigError, DataError, FormatError, MissingDependencyError

ONE_THREAD = OrtConfig(intra_op_num_threads=1)


def conv_relu_numpy(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    w = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    y = np.einsum("nchwij,ocij->nohw", sliding_window_view(xp, (3, 3), axis=(2, 3)), w["conv.w"])
    return np.maximum(y + w["conv.b"].reshape(1, -1, 1, 1), 0)


def det_float64_model() -> onnx.ModelProto:
    """A valid model ONNX Runtime's CPU provider has no kernel for (Det on float64)."""
    node = helper.make_node("Det", ["x"], ["y"], name="det")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.DOUBLE, (2, 2))],
                              [helper.make_tensor_value_info("y", TensorProto.DOUBLE, ())])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_runner_matches_numpy_for_proto_and_path(rng, tmp_path):
    model = models.conv_relu()
    x = rng.standard_normal((2, 3, 8, 8)).astype(np.float32)
    expected = conv_relu_numpy(model, x)
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    for source in (model, path, str(path)):
        with OnnxrtRunner(source, ONE_THREAD) as runner:
            np.testing.assert_allclose(runner.infer({"x": x})["y"], expected, rtol=1e-5, atol=1e-5)


def test_context_manager_activates_and_deactivates(rng):
    runner = OnnxrtRunner(models.conv_relu(), ONE_THREAD)
    assert isinstance(runner, Runner) and not runner.is_active
    with runner as active:
        assert active is runner and runner.is_active
    assert not runner.is_active
    with pytest.raises(BackendError) as err:
        runner.infer({"x": rng.standard_normal((1, 3, 8, 8)).astype(np.float32)})
    assert str(err.value) == "onnxrt: call activate() (or use `with`) before infer()."


def test_sessions_preallocate_no_memory_pattern():
    """A preallocated pattern block outgrows the live peak on graphs with many branches (the local graphs
    of the sensitivity evidence), so sessions allocate as they go."""
    with OnnxrtRunner(models.conv_relu(), ONE_THREAD) as runner:
        options = runner._session.get_session_options()
    assert options.enable_mem_pattern is False and options.intra_op_num_threads == 1


def test_input_specs_need_no_session():
    specs = OnnxrtRunner(models.conv_relu()).input_specs()
    assert list(specs) == ["x"] and specs["x"].shape == ("N", 3, 8, 8)
    assert specs["x"].dtype == np.float32


def test_feed_is_checked_before_running(rng):
    with OnnxrtRunner(models.conv_relu(), ONE_THREAD) as runner:
        with pytest.raises(DataError, match=r"input 'x' expects dtype float32, got float64"):
            runner.infer({"x": rng.standard_normal((1, 3, 8, 8))})
        with pytest.raises(DataError, match=r"feed lacks model input 'x'"):
            runner.infer({"z": np.zeros((1, 3, 8, 8), np.float32)})


def test_selected_and_unknown_outputs(rng):
    x = rng.standard_normal((1, 8)).astype(np.float32)
    with OnnxrtRunner(models.mlp(), ONE_THREAD) as runner:
        assert list(runner.infer({"x": x}, ["y"])) == ["y"]
        with pytest.raises(BackendError) as err:
            runner.infer({"x": x}, ["yy"])
    assert str(err.value) == "No graph output named 'yy' in the model. Did you mean 'y'?"


def test_missing_kernel_is_a_backend_error_with_a_fix():
    runner = OnnxrtRunner(det_float64_model(), ONE_THREAD)
    with pytest.raises(BackendError) as err:
        runner.activate()
    assert str(err.value).startswith("onnxrt: CPUExecutionProvider has no kernel for Det node 'det' with "
                                     "its input types.")
    assert isinstance(err.value.__cause__, Exception) and not runner.is_active


def test_unparseable_model_file_is_a_backend_error(tmp_path):
    path = tmp_path / "broken.onnx"
    path.write_bytes(b"not a model")
    with pytest.raises(BackendError, match=r"onnxrt: cannot create an inference session"):
        OnnxrtRunner(path).activate()


def test_unavailable_provider_is_refused_not_silently_replaced():
    if "CUDAExecutionProvider" in ort.get_available_providers():
        pytest.skip("CUDA is available here")
    config = OrtConfig(providers=("CUDAExecutionProvider", "CPUExecutionProvider"))
    runner = OnnxrtRunner(models.conv_relu(), config)
    with pytest.raises(BackendError) as err:
        runner.activate()
    assert str(err.value).startswith("onnxrt: execution provider CUDAExecutionProvider is not available in "
                                     "this onnxruntime build (available: ")


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"providers": ("CPUExecutionProviders",)},
     "Unknown execution provider 'CPUExecutionProviders'; quantdbg supports CPUExecutionProvider, "
     "CUDAExecutionProvider, TensorrtExecutionProvider. Did you mean 'CPUExecutionProvider'?"),
    ({"providers": "CPUExecutionProvider"}, "providers takes a sequence of provider names, not one string."),
    ({"providers": ()}, "providers is empty; list at least 'CPUExecutionProvider'."),
    ({"intra_op_num_threads": -1}, "intra_op_num_threads must be >= 0 (0: ONNX Runtime's default), got -1."),
    ({"graph_optimization_level": "max"},
     "graph_optimization_level must be one of ['all', 'basic', 'disable', 'extended'], got 'max'."),
    ({"log_severity_level": 7}, "log_severity_level must be in 0..4, got 7."),
])
def test_config_validation(kwargs, message):
    with pytest.raises(ConfigError) as err:
        OrtConfig(**kwargs)
    assert str(err.value) == message


def test_config_json_round_trip():
    config = OrtConfig(intra_op_num_threads=1, inter_op_num_threads=2, graph_optimization_level="basic")
    assert OrtConfig.from_dict(json.loads(json.dumps(config.to_dict()))) == config
    assert config.to_dict() == {"providers": ["CPUExecutionProvider"], "intra_op_num_threads": 1,
                                "inter_op_num_threads": 2, "graph_optimization_level": "basic",
                                "log_severity_level": 3, "fuse_qdq": False}
    assert OrtConfig.from_dict({}) == OrtConfig()
    gpu = OrtConfig(providers=("CUDAExecutionProvider", "CPUExecutionProvider"), fuse_qdq=True)
    assert OrtConfig.from_dict(json.loads(json.dumps(gpu.to_dict()))) == gpu
    with pytest.raises(FormatError, match=r"field 'providers\[0\]': expected one of"):
        OrtConfig.from_dict({"providers": ["GPU"]})


def test_disabled_optimizations_still_compute_the_same(rng):
    model = models.conv_relu()
    x = rng.standard_normal((1, 3, 8, 8)).astype(np.float32)
    with OnnxrtRunner(model, OrtConfig(intra_op_num_threads=1, graph_optimization_level="disable")) as r:
        np.testing.assert_allclose(r.infer({"x": x})["y"], conv_relu_numpy(model, x), rtol=1e-5, atol=1e-5)


def _backends_where_tensorrt_is(tensorrt: str, tmp_path) -> str:
    """What ``available()`` and ``make_runner_factory("tensorrt")`` say in a fresh interpreter where
    ``import tensorrt`` fails (``tensorrt="missing"``) or finds a folder of .pyi stubs only
    (``"stubs"``, what ``pip install tensorrt-stubs`` leaves), whatever this machine has installed."""
    (tmp_path / "tensorrt").mkdir()
    (tmp_path / "tensorrt" / "__init__.pyi").write_text("class Builder: ...\n")
    code = textwrap.dedent(f"""
        import importlib.machinery, sys
        class Finder:
            def find_spec(self, name, path=None, target=None):
                if name.split('.')[0] not in ('tensorrt', 'cuda'):
                    return None
                if {tensorrt!r} == 'missing' or name != 'tensorrt':
                    raise ImportError('blocked for test: ' + name)
                return importlib.machinery.PathFinder.find_spec(name, [{str(tmp_path)!r}])
        sys.meta_path.insert(0, Finder())
        from quantdbg.backends import available, make_runner_factory
        from quantdbg.errors import MissingDependencyError
        print(available())
        try:
            make_runner_factory('tensorrt')
        except MissingDependencyError as err:
            print(type(err).__name__)
    """)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout


@pytest.mark.parametrize("tensorrt", ["missing", "stubs"])
def test_available_backends_without_tensorrt_bindings(tensorrt, tmp_path):
    assert _backends_where_tensorrt_is(tensorrt, tmp_path) == "['onnxrt']\nMissingDependencyError\n"


def test_runner_factory(rng):
    factory = make_runner_factory("onnxrt", ONE_THREAD)
    assert factory == OnnxrtRunnerFactory(ONE_THREAD)
    runner = factory(models.conv_relu())
    assert isinstance(runner, OnnxrtRunner) and runner.config == ONE_THREAD and not runner.is_active
    assert make_runner_factory().config == OrtConfig()
    with pytest.raises(ConfigError) as err:
        make_runner_factory("onnxruntime")
    assert str(err.value) == "Unknown backend 'onnxruntime'; expected one of ['onnxrt', 'tensorrt']. " \
                             "Did you mean 'onnxrt'?"
    with pytest.raises(ConfigError, match=r"The onnxrt backend takes an OrtConfig, got dict."):
        make_runner_factory("onnxrt", {"intra_op_num_threads": 1})


def test_tensorrt_factory_needs_bindings():
    if "tensorrt" in available():
        pytest.skip("TensorRT is usable here")
    with pytest.raises(MissingDependencyError, match=r"needs TensorRT's Python bindings"):
        make_runner_factory("tensorrt")


def test_default_config_simulates_qdq_as_onnx_defines_it(rng):
    """ONNX Runtime's fused int8 kernels (MatMulIntegerToFloat here) are not what TensorRT runs.

    mlp4 quantized with fc2 left in FP32 reads a ReLU output into fc3's Q/DQ; ONNX Runtime 1.32's
    CPU fusion of that pattern differs from the Q/DQ arithmetic by far more than float rounding.
    The default runner must give what the graph says, the same as with every optimization off.
    """
    import models_sensitivity as ms

    from quantdbg.config import Precision
    from quantdbg.qdq import remove_qdq

    model = ms.mlp4()
    feeds = ms.feeds_for(model, rng)
    mixed = remove_qdq(ms.quantize_by_hand(model, feeds, {"act1": 0.01}), ["fc2"], Precision.FP32).model
    x = np.concatenate([f["x"] for f in feeds])
    with OnnxrtRunner(mixed, OrtConfig(intra_op_num_threads=1, graph_optimization_level="disable")) as r:
        exact = r.infer({"x": x})["y"]
    with OnnxrtRunner(mixed, ONE_THREAD) as r:
        default = r.infer({"x": x})["y"]
    np.testing.assert_allclose(default, exact, rtol=1e-5, atol=1e-5)
    assert not ONE_THREAD.fuse_qdq
