"""Results say the size of the model they were computed on and the memory their process used."""
from __future__ import annotations

from pathlib import Path

import models_large
import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from quantdbg.backends import OnnxrtRunnerFactory, OrtConfig
from quantdbg.calibration import CalibrationResult, calibrate
from quantdbg.fallback import FallbackConfig, FallbackPlan, FallbackTarget, auto_fallback
from quantdbg.model import load_model
from quantdbg.model.footprint import footprint
from quantdbg.qdq import quantize
from quantdbg.report.sections.registry import sections_of
from quantdbg.sensitivity import SensitivityConfig, SensitivityReport, VariantEvaluator

WIDTH = 32
LAYERS = 3
STATUS = Path("/proc/self/status")


@pytest.fixture
def stack(tmp_path):
    return models_large.matmul_stack(tmp_path, LAYERS * WIDTH * WIDTH * 4, WIDTH)


def _status_bytes(key: str) -> int:
    """A memory figure of this process from Linux's /proc (reported in kB)."""
    line = next(ln for ln in STATUS.read_text().splitlines() if ln.startswith(key + ":"))
    return int(line.split()[1]) * 1024


def test_weight_bytes_are_the_initializers_nbytes_without_reading_the_data_file(stack):
    loaded = load_model(stack)
    assert all(t.data_location == onnx.TensorProto.EXTERNAL for t in loaded.graph.initializer)
    full = onnx.load(str(stack))  # reads the data file
    expected = sum(numpy_helper.to_array(t).nbytes for t in full.graph.initializer)
    stack.with_name(stack.name + ".data").unlink()  # reading the weights now would fail
    assert footprint(loaded).weight_bytes == expected == LAYERS * WIDTH * WIDTH * 4


@pytest.mark.skipif(not STATUS.exists(), reason="the oracle reads Linux's /proc/self/status")
def test_peak_rss_is_the_process_high_water_mark_in_bytes(stack):
    before = _status_bytes("VmHWM")
    peak = footprint(load_model(stack)).peak_rss_bytes
    # The kernel's two counters may differ by a few pages (they sync lazily), never by the
    # factor 1024 of a unit mistake.
    assert before / 2 <= peak <= 2 * _status_bytes("VmHWM")


def _data() -> dict[str, np.ndarray]:
    return {"x": models_large.inputs(WIDTH, 16)}


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """Calibration, sensitivity report and fallback plan of one small external-data model."""
    path = models_large.matmul_stack(tmp_path_factory.mktemp("stack"), LAYERS * WIDTH * WIDTH * 4, WIDTH)
    calib = calibrate(path, _data())
    factory = OnnxrtRunnerFactory(OrtConfig(intra_op_num_threads=1))
    with VariantEvaluator(path, quantize(path, _data()), _data(), runner_factory=factory) as evaluator:
        result = auto_fallback(evaluator, FallbackTarget.min_sqnr(10.0),
                               FallbackConfig(SensitivityConfig(mode="local", evidence=False)))
    return {CalibrationResult: calib, SensitivityReport: result.report, FallbackPlan: result.plan}


@pytest.mark.parametrize("cls", [CalibrationResult, SensitivityReport, FallbackPlan])
def test_results_carry_it_through_json_and_into_the_report(results, cls):
    value = results[cls]
    got = value.footprint
    assert got.weight_bytes == LAYERS * WIDTH * WIDTH * 4 and got.peak_rss_bytes > got.weight_bytes
    assert cls.from_dict(value.to_dict()).footprint == got
    assert got.describe() in " ".join(p for s in sections_of(value) for p in s.paragraphs)


@pytest.mark.parametrize("cls", [CalibrationResult, SensitivityReport, FallbackPlan])
def test_results_written_before_the_footprint_existed_read_back_without_one(results, cls):
    old = results[cls].to_dict()
    del old["footprint"]
    back = cls.from_dict(old)
    assert back.footprint is None
    assert back.to_dict() == {k: v for k, v in results[cls].to_dict().items() if k != "footprint"}
