"""The parts of the TensorRT backend that run without TensorRT.

Nothing here exercises TensorRT: the inspector tests check *our parser* on JSON documents written
by hand after TensorRT's documented engine-inspector format (the Developer Guide's kDETAILED
example, and the TensorRT 11 migration notes that split "Format/Datatype"). The runner itself is
tested in tests/trt/, which skips where TensorRT cannot be imported.
"""
from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import tensorrt_presence

from quantdbg.backends.tensorrt import (
    LatencyResult,
    LayerPrecision,
    ShapeRange,
    TrtConfig,
    parse_engine_info,
    unavailable_reason,
)
from quantdbg.backends.tensorrt.config import resolve_profile
from quantdbg.backends.tensorrt.inspector import precision_counts, type_of_format
from quantdbg.errors import BackendError, ConfigError, FormatError
from quantdbg.model.specs import TensorSpec

# A TensorRT 10 engine document shaped like the Developer Guide's example (kDETAILED verbosity).
TRT10_DOC = {
    "Layers": [
        {"Name": "Reformatting CopyNode for Input Tensor 0 to conv1 + relu1", "LayerType": "Reformat",
         "Inputs": [{"Name": "x", "Location": "Device", "Dimensions": [4, 16, 8, 8],
                     "Format/Datatype": "Row major linear FP32"}],
         "Outputs": [{"Name": "Reformatted Input Tensor 0 to conv1 + relu1", "Location": "Device",
                      "Dimensions": [4, 16, 8, 8],
                      "Format/Datatype": "Thirty-two wide channel vectorized row major Int8 format."}],
         "ParameterType": "Reformat", "Origin": "QDQ", "TacticValue": "0x0000000000000000"},
        {"Name": "conv1 + relu1", "LayerType": "CaskConvolution",
         "Inputs": [{"Name": "x.q", "Location": "Device", "Dimensions": [4, 16, 8, 8],
                     "Format/Datatype": "Thirty-two wide channel vectorized row major Int8 format."}],
         "Outputs": [{"Name": "relu1_out", "Location": "Device", "Dimensions": [4, 16, 8, 8],
                      "Format/Datatype": "Channel major INT8 format where channel % 16 == 0"}],
         "ParameterType": "Convolution", "Kernel": [3, 3], "Weights": {"Type": "Int8", "Count": 2304},
         "TacticName": "sm80_xmma_fprop_implicit_gemm_interleaved_i8i8_i8i32_f32_nchw_vect_c_32kcrs",
         "TacticValue": "0x11bde0e1d9f2f35d",
         "Metadata": "[ONNX Layer: conv1]\x1f[ONNX Layer: relu1]"},
        {"Name": "conv_fp16", "LayerType": "CaskConvolution",
         "Inputs": [{"Name": "half", "Dimensions": [4, 16, 8, 8],
                     "Format/Datatype": "Channel major FP16 format where channel % 8 == 0"}],
         "Outputs": [{"Name": "c16", "Dimensions": [4, 16, 8, 8], "Format/Datatype": "Half"}],
         "TacticValue": "0x0000000000000a2c", "Metadata": "[ONNX Layer: conv_fp16]"},
        {"Name": "gap", "LayerType": "kgen", "Inputs": [{"Name": "b", "Format/Datatype": "BFloat16"}],
         "Outputs": [{"Name": "o", "Format/Datatype": "Float"}], "TacticName": "", "TacticValue": "0x1"},
    ],
    "Bindings": ["x", "y"],
}

EXPECTED = (
    LayerPrecision("Reformatting CopyNode for Input Tensor 0 to conv1 + relu1", "Reformat", "FP32",
                   ("Row major linear FP32",),
                   ("Thirty-two wide channel vectorized row major Int8 format.",), "0x0000000000000000", ()),
    LayerPrecision("conv1 + relu1", "CaskConvolution", "INT8",
                   ("Thirty-two wide channel vectorized row major Int8 format.",),
                   ("Channel major INT8 format where channel % 16 == 0",),
                   "sm80_xmma_fprop_implicit_gemm_interleaved_i8i8_i8i32_f32_nchw_vect_c_32kcrs",
                   ("conv1", "relu1")),
    LayerPrecision("conv_fp16", "CaskConvolution", "FP16",
                   ("Channel major FP16 format where channel % 8 == 0",), ("Half",), "0x0000000000000a2c",
                   ("conv_fp16",)),
    LayerPrecision("gap", "kgen", "BF16", ("BFloat16",), ("Float",), "0x1", ()),
)


def test_parse_tensorrt10_engine_document():
    assert parse_engine_info(json.dumps(TRT10_DOC)) == EXPECTED


def test_parse_tensorrt11_split_fields_and_io_tensors():
    doc = {"Layers": [{"Name": "fc", "LayerType": "CaskGemmMatrixMultiply",
                       "Inputs": [{"Name": "a", "DataType": "Int8",
                                   "Format": "Row major linear format (kLINEAR)"}],
                       "Outputs": [{"Name": "y", "DataType": "Float", "Format": "Row major linear format"}],
                       "TacticName": "gemm_i8", "Metadata": "[ONNX Layer: fc]"}],
           "I/O Tensors": [{"Name": "a", "IOMode": "Input", "DataType": "Float"}]}
    layer, = parse_engine_info(json.dumps(doc))
    assert (layer.precision, layer.tactic, layer.onnx_nodes) == ("INT8", "gemm_i8", ("fc",))
    assert layer.input_formats == ("Int8 / Row major linear format (kLINEAR)",)


def test_parse_names_only_single_layer_and_dynamic_shapes():
    names_only = parse_engine_info(json.dumps({"Layers": ["conv1 + relu1", "fc"], "Bindings": ["x"]}))
    assert names_only == (LayerPrecision("conv1 + relu1", "unknown", "unknown"),
                          LayerPrecision("fc", "unknown", "unknown"))
    single = parse_engine_info(json.dumps(TRT10_DOC["Layers"][1]))  # get_layer_information output
    assert single == (EXPECTED[1],)
    dynamic = {"Name": "conv", "LayerType": "CaskConvolution",
               "Inputs": [{"Name": "x", "Dimensions": [-1, 16, 8, 8],
                           "Format/Datatype": "N/A due to dynamic shapes"}],
               "Outputs": []}
    assert parse_engine_info(json.dumps([dynamic]))[0].precision == "unknown"


def test_metadata_with_several_separators_and_brackets_in_names():
    meta = "[ONNX Layer: /blocks.0/attn/MatMul]\x1e[ONNX Layer: a[0]]\x1f[ONNX Layer: b]"
    doc = [{"Name": "fused", "LayerType": "kgen", "Metadata": meta}]
    assert parse_engine_info(json.dumps(doc))[0].onnx_nodes == ("/blocks.0/attn/MatMul", "a[0]", "b")


@pytest.mark.parametrize("text, message", [
    ("not json", "Engine inspector output: not valid JSON"),
    ("[" * 100 + "]" * 100, "nested deeper than 64 levels"),
    (json.dumps({"Layers": {"a": 1}}), "expected a list"),
    (json.dumps([{"LayerType": "x"}]), "not an object with a 'Name'"),
])
def test_parse_errors(text, message):
    with pytest.raises(BackendError, match=message):
        parse_engine_info(text)


@pytest.mark.parametrize("description, expected", [
    ("Row major linear FP32", "FP32"), ("Float", "FP32"), ("Half", "FP16"), ("BFloat16", "BF16"),
    ("Channel major INT8 format where channel == 4 and column stride % 32 == 0", "INT8"),
    ("Row major linear UInt8 format", "UINT8"), ("Row major linear Int32", "INT32"),
    ("Row major linear FP8 format", "FP8"), ("Row major linear BOOL", "BOOL"),
    ("N/A due to dynamic shapes", "unknown"), ("", "unknown"),
])
def test_type_of_format(description, expected):
    assert type_of_format(description) == expected


def test_precision_counts_and_layer_round_trip():
    assert precision_counts(EXPECTED) == {"BF16": 1, "FP16": 1, "FP32": 1, "INT8": 1}
    assert precision_counts(EXPECTED[:2] + EXPECTED[1:2]) == {"INT8": 2, "FP32": 1}
    for layer in EXPECTED:
        assert LayerPrecision.from_dict(json.loads(json.dumps(layer.to_dict()))) == layer


def test_latency_statistics_match_numpy():
    times = (3.0, 1.0, 2.0, 10.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 0.5)
    result = LatencyResult(times, {"x": (4, 16, 8, 8)})
    assert result.mean_ms == pytest.approx(np.mean(times))
    assert result.median_ms == pytest.approx(np.median(times))
    assert result.p90_ms == np.percentile(times, 90, method="inverted_cdf")
    restored = LatencyResult.from_dict(json.loads(json.dumps(result.to_dict())))
    assert restored == result and restored.input_shapes["x"] == (4, 16, 8, 8)
    with pytest.raises(ConfigError, match="at least one timed iteration"):
        LatencyResult(())


SPECS = {"x": TensorSpec("x", np.dtype(np.float32), ("N", 16, 8, 8)),
         "ids": TensorSpec("ids", np.dtype(np.int64), (1, "T")),
         "static": TensorSpec("static", np.dtype(np.float32), (2, 3))}


def test_resolve_profile_fills_batch_and_takes_explicit_ranges():
    explicit = {"ids": ShapeRange((1, 1), (1, 64), (1, 512))}
    profile = resolve_profile(SPECS, explicit, (1, 4, 8))
    assert profile == {"x": ShapeRange((1, 16, 8, 8), (4, 16, 8, 8), (8, 16, 8, 8)), "ids": explicit["ids"]}


@pytest.mark.parametrize("shapes, message", [
    ({}, r"Input 'ids' has shape \(1, T\) with dynamic axes \[1\]"),
    ({"ids": ShapeRange((1,), (2,), (3,))}, "has rank 1, but the input has shape"),
    ({"ids": ShapeRange((1, 1), (2, 8), (3, 9))}, "sets axis 0 to 1..3, but that axis is fixed at 1"),
    ({"idz": ShapeRange((1, 1), (1, 1), (1, 1))}, "No input named 'idz' in the model. Did you mean 'ids'"),
])
def test_resolve_profile_errors(shapes, message):
    with pytest.raises(ConfigError, match=message):
        resolve_profile(SPECS, shapes, (1, 4, 8))


@pytest.mark.parametrize("kwargs, message", [
    ({"batch": (4, 2, 8)}, r"1 <= min <= opt <= max, got \(4, 2, 8\)"),
    ({"batch": (1, 2)}, "batch must be"),
    ({"workspace_bytes": 0}, "workspace_bytes must be > 0"),
    ({"builder_optimization_level": 9}, r"builder_optimization_level must be in \[0, 5\] or None, got 9"),
    ({"shapes": {"x": (1, 2)}}, "must be a ShapeRange"),
    ({"save_engine": "a.plan", "load_engine": "b.plan"}, "save_engine and load_engine are both set"),
])
def test_trt_config_validation(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        TrtConfig(**kwargs)


@pytest.mark.parametrize("args, message", [
    (((1, 2), (1, 2, 3), (1, 2, 3)), "ranks differ"),
    (((2, 3), (1, 3), (4, 3)), "min <= opt <= max"),
    (((-1, 3), (1, 3), (4, 3)), "negative dimension"),
])
def test_shape_range_validation(args, message):
    with pytest.raises(ConfigError, match=message):
        ShapeRange(*args)


def test_trt_config_round_trip_and_immutability(tmp_path):
    config = TrtConfig(batch=[1, 2, 4], shapes={"x": ShapeRange([1, 3], [2, 3], [4, 3])},
                       workspace_bytes=1 << 30, builder_optimization_level=5, tf32=False,
                       timing_cache=str(tmp_path / "t.cache"), save_engine=tmp_path / "e.plan")
    assert config.batch == (1, 2, 4) and config.shapes["x"].min == (1, 3)
    assert TrtConfig.from_dict(json.loads(json.dumps(config.to_dict()))) == config
    with pytest.raises(TypeError):
        config.shapes["y"] = ShapeRange((1,), (1,), (1,))  # type: ignore[index]


def test_json_keeps_the_keys_earlier_files_were_written_with(tmp_path):
    config = TrtConfig(batch=(1, 2, 4), shapes={"x": ShapeRange((1, 3), (2, 3), (4, 3))}, tf32=False,
                       timing_cache="t.cache", save_engine="e.plan")
    assert json.loads(json.dumps(config.to_dict())) == {
        "batch": [1, 2, 4], "shapes": {"x": {"min": [1, 3], "opt": [2, 3], "max": [4, 3]}},
        "workspace_bytes": None, "builder_optimization_level": None, "tf32": False, "timing_cache": "t.cache",
        "save_engine": "e.plan", "load_engine": None}
    assert LayerPrecision("a", "b", "INT8", ("i",), ("o",), "t", ("n",)).to_dict() == {
        "name": "a", "layer_type": "b", "precision": "INT8", "input_formats": ["i"], "output_formats": ["o"],
        "tactic": "t", "onnx_nodes": ["n"]}
    # The summary statistics are written for readers and ignored (recomputed) when read back.
    latency = {"times_ms": [3.0, 1.0, 2.0, 10.0], "input_shapes": {"x": [4, 16, 8, 8]}, "mean_ms": 4.0,
               "median_ms": 2.5, "p90_ms": 10.0, "min_ms": 1.0, "max_ms": 10.0}
    assert LatencyResult((3.0, 1.0, 2.0, 10.0), {"x": (4, 16, 8, 8)}).to_dict() == latency
    assert LatencyResult.from_dict({**latency, "mean_ms": 99.0}).mean_ms == 4.0


def test_shape_range_round_trip_and_malformed_json_names_the_field():
    rng = ShapeRange((1, 3, 8), (4, 3, 8), (16, 3, 8))
    assert ShapeRange.from_dict(json.loads(json.dumps(rng.to_dict()))) == rng
    with pytest.raises(FormatError, match=r"field 'batch': expected a list of 3 items"):
        TrtConfig.from_dict({"batch": [1, 2]})
    with pytest.raises(FormatError, match=r"field 'shapes.x.opt' is missing"):
        TrtConfig.from_dict({"shapes": {"x": {"min": [1], "max": [2]}}})
    with pytest.raises(FormatError, match=r"field 'shapes.x': ShapeRange needs min <= opt <= max"):
        TrtConfig.from_dict({"shapes": {"x": {"min": [2], "opt": [1], "max": [3]}}})


def _run(code: str, pythonpath: str | None = None) -> str:
    env = None if pythonpath is None else {**os.environ, "PYTHONPATH": pythonpath}
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                            env=env, check=True)
    return result.stdout


def _real_tensorrt() -> bool:
    try:
        return hasattr(importlib.import_module("tensorrt"), "Builder")
    except ImportError:
        return False


@pytest.mark.skipif(_real_tensorrt(), reason="real TensorRT bindings are installed: a regular package wins "
                                             "over the stub-only namespace folder this test builds")
def test_stub_only_tensorrt_is_reported_as_missing(tmp_path):
    """A `tensorrt/` folder with only .pyi files (what tensorrt-stubs installs) imports as an empty
    namespace package; the backend must say TensorRT is missing, not fail with AttributeError."""
    (tmp_path / "tensorrt").mkdir()
    (tmp_path / "tensorrt" / "__init__.pyi").write_text("class Builder: ...\n")
    out = _run("""
        import models_lint
        from quantdbg.backends.tensorrt import TrtRunner, unavailable_reason
        from quantdbg.errors import MissingDependencyError
        print("REASON:", unavailable_reason())
        runner = TrtRunner(models_lint.clean_conv_block())
        print("INPUTS:", list(runner.input_specs()))
        try:
            runner.activate()
        except MissingDependencyError as err:
            print("ACTIVATE:", err)
        print("ACTIVE:", runner.is_active)
    """, pythonpath=f"{tmp_path}:{_tests_dir()}")
    assert "REASON: 'tensorrt' imports from" in out and "but has no bindings (no tensorrt.Builder)" in out
    assert "INPUTS: ['x']" in out
    assert "ACTIVATE: 'tensorrt' imports from" in out and "ACTIVE: False" in out


def test_blocked_tensorrt_names_the_extra():
    out = _run("""
        import sys
        class Block:
            def find_spec(self, name, path=None, target=None):
                if name.split('.')[0] in ('tensorrt', 'cuda'):
                    raise ImportError('blocked for test: ' + name)
        sys.meta_path.insert(0, Block())
        from quantdbg.backends.tensorrt import build_engine, unavailable_reason
        from quantdbg.errors import MissingDependencyError
        print(unavailable_reason())
        try:
            build_engine("unused.onnx")
        except MissingDependencyError as err:
            print("BUILD:", err)
    """)
    assert "install `quantdbg[tensorrt]`" in out and "BUILD: 'tensorrt' is required here" in out


def _tests_dir() -> str:
    return str(Path(__file__).resolve().parents[1])


def test_unavailable_reason_agrees_with_the_imports_and_the_device_query_made_here():
    """The TensorRT tests skip on this reason: it must say what is really missing, or nothing."""
    tensorrt_presence.check_agreement(unavailable_reason())
