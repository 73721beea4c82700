"""Models saved with external data, end to end: weights stay in their data file, results equal the
in-memory model's, outputs keep external data. The slow test does the same past protobuf's 2 GB."""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import models_large
import numpy as np
import onnx
import onnxruntime as ort
import pytest

from quantdbg import analyze_sensitivity, auto_fallback, quantize
from quantdbg.cli import main
from quantdbg.config import Precision
from quantdbg.fallback import FallbackConfig, FallbackTarget
from quantdbg.model import load_model
from quantdbg.sensitivity import SensitivityConfig, VariantEvaluator

WIDTH = 64


@pytest.fixture
def stack(tmp_path):
    folder = tmp_path / "in"
    folder.mkdir()
    model = models_large.matmul_stack(folder, 4 * WIDTH * WIDTH * 4, WIDTH)  # 4 layers, 64 kB
    np.savez(folder / "calib.npz", x=models_large.inputs(WIDTH, 32))
    np.savez(folder / "eval.npz", x=models_large.inputs(WIDTH, 16, seed=2))
    return model


def _digests(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def _run(path: Path, x: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


def _external_locations(path: Path) -> set[str]:
    stored = onnx.load(str(path), load_external_data=False)
    return {entry.value for init in stored.graph.initializer for entry in init.external_data
            if entry.key == "location"}


def test_loading_keeps_the_weights_in_their_data_file(stack):
    loaded = load_model(stack)
    assert all(init.data_location == onnx.TensorProto.EXTERNAL for init in loaded.graph.initializer)
    assert loaded.ByteSize() < 4096  # the graph alone: 64 kB of weights stayed on disk


def test_api_on_external_data_equals_the_in_memory_model_and_saves_external_data(stack, tmp_path):
    folder, before = stack.parent, _digests(stack.parent)
    calib, evals = folder / "calib.npz", folder / "eval.npz"
    inline = onnx.load(str(stack))  # the same model, every weight in memory
    q_ext, q_mem = quantize(stack, calib), quantize(inline, calib)
    assert q_ext.records == q_mem.records
    q_ext.save(tmp_path / "int8.onnx")
    q_mem.save(tmp_path / "int8_mem.onnx")
    assert _external_locations(tmp_path / "int8.onnx") == {"int8.onnx.data"}
    assert _external_locations(tmp_path / "int8_mem.onnx") == set()  # a small in-memory input stays one file
    models_large.checked(tmp_path / "int8.onnx")
    x = np.load(evals)["x"]
    np.testing.assert_array_equal(_run(tmp_path / "int8.onnx", x), _run(tmp_path / "int8_mem.onnx", x))

    config = SensitivityConfig(mode="local", evidence=False, output_samples=0)
    ext = analyze_sensitivity(stack, q_ext, evals, config)
    mem = analyze_sensitivity(inline, q_mem, evals, config)
    assert ext.ranking == mem.ranking and ext.layers == mem.layers and ext.tensors == mem.tensors
    mixed = _fallback(stack, q_ext, evals, ext)
    assert mixed.plan == _fallback(inline, q_mem, evals, mem).plan
    mixed.mixed.save(tmp_path / "mixed.onnx")
    assert _external_locations(tmp_path / "mixed.onnx") == {"mixed.onnx.data"}
    models_large.checked(tmp_path / "mixed.onnx")
    assert _digests(folder) == before  # the input model and its data file are untouched


def _fallback(model, qmodel, evals, report):
    with VariantEvaluator(model, qmodel, evals, "sqnr") as evaluator:
        int8 = evaluator.run(evaluator.layers).value
        target = FallbackTarget.min_sqnr(int8 + 3.0)  # above all-INT8, below all-FP32 (no error at all)
        result = auto_fallback(evaluator, target, FallbackConfig(precision=Precision.FP32), report=report)
    assert result.plan.status == "met" and result.plan.value >= target.threshold
    assert 0 < len(result.plan.exclude) < len(qmodel.layers)
    return result


def test_cli_on_external_data_writes_external_data(stack, tmp_path, capsys):
    pytest.importorskip("matplotlib", reason="the HTML report's plots need the [report] extra (matplotlib)")
    folder, before = stack.parent, _digests(stack.parent)
    data = ["--data", str(folder / "calib.npz"), "--eval", str(folder / "eval.npz")]
    out = tmp_path / "out"
    out.mkdir()
    assert main(["calibrate", str(stack), data[0], data[1], "--out", str(out / "int8.onnx")]) == 0
    assert main(["analyze", str(stack), *data, "--mode", "local", "--out", str(out / "sens.json")]) == 0
    assert main(["fallback", str(stack), *data, "--min-sqnr", "10", "--out", str(out / "mixed.onnx"),
                 "--plan", str(out / "plan.json")]) == 0
    assert main(["report", str(out / "sens.json"), "--md", str(out / "sens.md")]) == 0
    capsys.readouterr()
    assert sorted(p.name for p in out.iterdir()) == [
        "int8.onnx", "int8.onnx.data", "mixed.onnx", "mixed.onnx.data", "plan.json", "sens.json", "sens.md"]
    for name in ("int8.onnx", "mixed.onnx"):
        assert _external_locations(out / name) == {f"{name}.data"}
        models_large.checked(out / name)
    assert json.loads((out / "plan.json").read_text())["status"] == "met"
    assert _digests(folder) == before


SLOW_CHILD = textwrap.dedent("""
    import json, resource, sys
    from quantdbg.cli import main
    status = main(sys.argv[1:])
    print(json.dumps({"status": status, "peak_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}))
""")


def _measured(args: list[str]) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-c", SLOW_CHILD, *args], capture_output=True, text=True,
                          env=env, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_a_model_past_2_gb_calibrates_and_falls_back_within_the_memory_budget():
    with tempfile.TemporaryDirectory(prefix="quantdbg-2gb-") as tmp:  # 4.4 GB on disk, removed at once
        _past_2_gb(Path(tmp))


def _past_2_gb(tmp_path: Path) -> None:
    width = 4096
    model = models_large.matmul_stack(tmp_path, 2**31 + 2**26, width)  # 33 layers of 64 MiB: 2.2 GB
    weight_bytes = (tmp_path / "model.onnx.data").stat().st_size
    np.savez(tmp_path / "calib.npz", x=models_large.inputs(width, 32))
    np.savez(tmp_path / "eval.npz", x=models_large.inputs(width, 16, seed=2))
    data = ["--data", str(tmp_path / "calib.npz")]
    calib = _measured(["calibrate", str(model), *data, "--out", str(tmp_path / "int8.onnx")])
    fallback = _measured(["fallback", str(model), *data, "--eval", str(tmp_path / "eval.npz"),
                          "--min-sqnr", "25", "--precision", "fp32", "--out", str(tmp_path / "mixed.onnx"),
                          "--plan", str(tmp_path / "plan.json")])
    plan = json.loads((tmp_path / "plan.json").read_text())
    print(f"weights {weight_bytes / 2**30:.2f} GiB; peak RSS calibrate {calib['peak_kib'] / 2**20:.2f} GiB, "
          f"fallback {fallback['peak_kib'] / 2**20:.2f} GiB; plan {plan['status']}, "
          f"{len(plan['exclude'])} layer(s) excluded, SQNR {plan['value']:.2f} dB")
    assert plan["status"] == "met" and plan["value"] >= 25
    for name in ("int8.onnx", "mixed.onnx"):
        assert _external_locations(tmp_path / name) == {f"{name}.data"}
        onnx.checker.check_model(str(tmp_path / name))
    # Calibration meets its goal (2x the weights plus one batch; about 1.1x here). The fallback's
    # sessions hold the FP32 weights plus their INT8 copy (the switchable graph) or a quarter of them
    # fake-quantized (each local-graph session): at most 1.5x the weights plus 1 GiB.
    assert calib["peak_kib"] * 1024 < 3 * weight_bytes + 2**30
    assert fallback["peak_kib"] * 1024 < 1.5 * weight_bytes + 2**30
