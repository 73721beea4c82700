"""The embedded digits CNN and the one-call demo."""
from __future__ import annotations

import json
import math
from importlib import resources
from pathlib import Path

import numpy as np
import onnx
import pytest
from tool_grammars import modelopt, run, trtexec, trtexec_shapes

from quantdbg.demo import (
    INPUT_NAME,
    OUTPUT_NAME,
    DemoResult,
    VariantScore,
    export_demo,
    load_embedded,
    preprocess_digits,
    run_demo,
)
from quantdbg.errors import ConfigError, DataError
from quantdbg.report import ReportBundle, load_result


def test_preprocess_matches_a_plain_loop():
    pixels = np.random.default_rng(0).integers(0, 17, (3, 8, 8)).astype(np.uint8)
    got = preprocess_digits(pixels)
    assert got.dtype == np.float32 and got.shape == (3, 1, 16, 16)
    for n in range(3):
        for i in range(16):
            for j in range(16):
                assert got[n, 0, i, j] == np.float32((pixels[n, i // 2, j // 2] / 16.0 - 0.5) / 0.5)


def test_preprocess_rejects_other_shapes():
    with pytest.raises(DataError, match=r"shape \[N,8,8\], got \(2, 64\)"):
        preprocess_digits(np.zeros((2, 64)))


def test_embedded_model_and_data_are_small_consistent_and_fresh():
    emb = load_embedded()
    folder = Path(str(resources.files("quantdbg").joinpath("_data")))
    assert sum(p.stat().st_size for p in folder.iterdir()) < 1_000_000
    model = onnx.load(str(emb.model_path))
    onnx.checker.check_model(model)
    assert [i.name for i in model.graph.input] == [INPUT_NAME]
    assert [o.name for o in model.graph.output] == [OUTPUT_NAME]
    assert model.graph.input[0].type.tensor_type.shape.dim[0].dim_param  # dynamic batch
    ops = {n.op_type for n in model.graph.node}
    assert {"Conv", "Add", "MaxPool", "Gemm"} <= ops and "BatchNormalization" not in ops
    assert emb.calib[INPUT_NAME].shape == (256, 1, 16, 16)
    assert emb.eval_inputs[INPUT_NAME].shape == (540, 1, 16, 16) and emb.labels.shape == (540,)
    assert set(np.unique(emb.labels)) == set(range(10))
    assert not np.shares_memory(load_embedded().calib[INPUT_NAME], emb.calib[INPUT_NAME])
    # calibration samples are training images: none equals a held-out evaluation image
    calib = {x.tobytes() for x in emb.calib[INPUT_NAME]}
    assert not any(x.tobytes() in calib for x in emb.eval_inputs[INPUT_NAME])


def test_embedded_model_is_accurate():
    import onnxruntime as ort

    emb = load_embedded()
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    session = ort.InferenceSession(str(emb.model_path), opts, providers=["CPUExecutionProvider"])
    logits = session.run(None, emb.eval_inputs)[0]
    assert (logits.argmax(1) == emb.labels).mean() >= 0.97


def test_run_demo_refuses_a_missing_folder(tmp_path):
    with pytest.raises(ConfigError, match="does not exist; create it first"):
        run_demo(tmp_path / "nope")


def test_run_demo_meets_its_target_and_writes_only_its_folder(tmp_path):
    pytest.importorskip("matplotlib", reason="the demo's HTML report needs the [report] extra (matplotlib)")
    result = run_demo(tmp_path, min_sqnr_db=40.0, threads=1)
    fp32, int8, mixed = result.scores
    assert (fp32.name, int8.name, mixed.name) == ("FP32", "INT8", "mixed")
    assert math.isinf(fp32.sqnr_db) and mixed.sqnr_db >= 40.0 > int8.sqnr_db
    assert int8.int8_layers == result.n_layers == mixed.int8_layers + len(result.excluded)
    assert result.excluded and result.excluded[0] == result.culprits[0][0]  # the worst layer goes first
    assert abs(int8.top1 - fp32.top1) <= 0.005  # INT8 entropy within 0.5 points of FP32
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(result.files)
    again = load_result(tmp_path / "report.json")
    assert isinstance(again, ReportBundle) and again.summary.rows[2][1] == mixed.int8_layers
    mixed_model = onnx.load(str(tmp_path / "digits_cnn_mixed.onnx"))
    dq_outputs = {o for n in mixed_model.graph.node if n.op_type == "DequantizeLinear" for o in n.output}
    fed_by_dq = {n.name for n in mixed_model.graph.node if set(n.input) & dq_outputs}
    weighted = {n.name for n in mixed_model.graph.node if n.op_type in ("Conv", "Gemm")}
    assert not set(result.excluded) & fed_by_dq  # excluded layers lost their Q/DQ pairs
    assert weighted - set(result.excluded) <= fed_by_dq  # every other layer kept them
    text = result.summary_text()
    assert all(name in text for name in result.excluded)
    # conv2/Conv reads `relu`, whose clip entropy sets several dB below mse's: the doctor says so, with
    # the INT8 fix to try before FP16.
    doctor = result.bundle.results[3]
    [finding] = [f for f in doctor.findings if f.check == "calibrator_disagreement"]
    relu = next(c for c in doctor.calibrators if c.tensor == "relu")
    assert finding.subjects[0] == "relu" and relu.best == "mse" and relu.gain_db >= 3.0
    assert "--per-tensor relu=mse" in finding.fix
    plan = json.loads((tmp_path / "fallback_plan.json").read_text())
    assert f"--onnx={tmp_path / 'digits_cnn_mixed.onnx'}" in plan["tensorrt"]["trtexec"]
    # ModelOpt's command reads the files written beside the plan (never a path inside the package),
    # and they are the files `quantdbg demo --export` writes.
    mo = run(plan["modelopt"]["command"], ["python", "-m", "modelopt.onnx.quantization"], modelopt())
    assert (mo.onnx_path, mo.calibration_data_path) == (str(tmp_path / "model.onnx"),
                                                        str(tmp_path / "calib.npz"))
    assert mo.nodes_to_exclude == list(result.excluded)
    (tmp_path / "exported").mkdir()
    exported = export_demo(tmp_path / "exported")
    for name in ("model.onnx", "calib.npz"):
        assert (tmp_path / name).read_bytes() == exported[name].read_bytes()
    # The profile rule of every command: any batch from 1 to the batch size the demo evaluated with (32).
    built = run(plan["tensorrt"]["trtexec"], ["trtexec"], trtexec())
    assert [trtexec_shapes(getattr(built, f"{w}Shapes")) for w in ("min", "opt", "max")] == [
        {INPUT_NAME: (n, 1, 16, 16)} for n in (1, 32, 32)]


def test_summary_text_is_the_table_the_readme_shows():
    scores = (VariantScore("FP32", 0, 536 / 540, math.inf), VariantScore("INT8", 8, 536 / 540, 34.94),
              VariantScore("mixed", 6, 536 / 540, 42.81))
    result = DemoResult(scores, 8, (("conv2/Conv", 36.04), ("fc2/Gemm", 44.8)), ("conv2/Conv", "fc2/Gemm"),
                        bundle=None, files={}, seconds=1.0)
    assert result.summary_text() == (
        "model     INT8 layers    top-1  logits SQNR vs FP32\n"
        "FP32              0/8   99.26%                    -\n"
        "INT8              8/8   99.26%              34.9 dB\n"
        "mixed             6/8   99.26%              42.8 dB\n"
        "top culprit layers (output SQNR with only that layer in INT8): "
        "conv2/Conv 36.0 dB, fc2/Gemm 44.8 dB\n"
        "kept out of INT8 by the fallback search: conv2/Conv, fc2/Gemm\n")
    nothing_kept = DemoResult(scores[:1], 8, (), (), bundle=None, files={}, seconds=1.0)
    assert nothing_kept.summary_text().endswith("kept out of INT8 by the fallback search: none\n")
