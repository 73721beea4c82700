"""The embedded digits CNN and the demo: ``quantdbg.auto`` on it, with a printout."""
from __future__ import annotations

import dataclasses
import json
import math
from importlib import resources
from pathlib import Path

import numpy as np
import onnx
import pytest
from tool_grammars import modelopt, run, trtexec, trtexec_shapes

from quantdbg.demo import (
    DEMO_MIN_SQNR_DB,
    FINAL_FILE,
    INPUT_NAME,
    OUTPUT_NAME,
    RUN_FILES,
    VariantScore,
    export_demo,
    load_embedded,
    preprocess_digits,
    run_demo,
)
from quantdbg.errors import ConfigError, DataError
from quantdbg.pipeline import AutoResult, apply_recipe
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


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    pytest.importorskip("matplotlib", reason="the demo's HTML report needs the [report] extra (matplotlib)")
    folder = tmp_path_factory.mktemp("demo")
    return folder, run_demo(folder, threads=1)


def _logits(model_path) -> np.ndarray:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    # Q/DQ pairs run as written (not fused into ORT's integer kernels), as quantdbg runs them.
    opts.add_session_config_entry("session.disable_quant_qdq", "1")
    session = ort.InferenceSession(str(model_path), opts, providers=["CPUExecutionProvider"])
    return session.run([OUTPUT_NAME], load_embedded().eval_inputs)[0].astype(np.float64)


def _sqnr_db(reference: np.ndarray, got: np.ndarray) -> float:
    return float(10.0 * np.log10(np.sum(reference ** 2) / np.sum((reference - got) ** 2)))


def test_the_demo_is_auto_and_its_table_describes_the_models_it_wrote(demo):
    folder, result = demo
    assert sorted(p.name for p in folder.iterdir()) == sorted(RUN_FILES) == sorted(result.files)
    fp32, int8, final = result.scores
    assert (fp32.name, int8.name, final.name) == ("FP32", "INT8", "final")
    auto = result.auto
    assert (int8.int8_layers, final.int8_layers) == (auto.n_layers, auto.n_layers - len(auto.exclude))
    # Each row's numbers, recomputed with NumPy from the model files the demo wrote: the INT8 row is the
    # default INT8 model the flow started from, the final row the flow's final model.
    labels = load_embedded().labels
    reference = _logits(folder / "model.onnx")
    assert math.isinf(fp32.sqnr_db) and fp32.top1 == pytest.approx((reference.argmax(1) == labels).mean())
    for row, name in ((int8, "digits_cnn_int8.onnx"), (final, FINAL_FILE)):
        logits = _logits(folder / name)
        assert row.sqnr_db == pytest.approx(_sqnr_db(reference, logits), abs=1e-3), name
        assert abs(row.top1 - (logits.argmax(1) == labels).mean()) <= 1 / len(labels), name
    assert (int8.sqnr_db, final.sqnr_db) == (auto.int8_value, auto.final_value)  # the flow's own numbers


def test_the_demo_shows_the_whole_job(demo):
    _, result = demo
    auto = result.auto
    # Repairs first, then a ranking and the fallback search: if the repairs alone ever meet the target,
    # raise DEMO_MIN_SQNR_DB so the demo still shows the search.
    assert auto.outcome == "fallback" and auto.met, auto.message
    assert auto.int8_value <= auto.repaired_value < DEMO_MIN_SQNR_DB <= auto.final_value
    assert auto.repairs and auto.report is not None and auto.plan is not None and auto.plan.evaluations
    assert [layer.node for layer in result.culprits] == [layer.node for layer in auto.report.layers[:3]]
    assert result.culprits[0].node in auto.exclude  # the worst layer is kept out of INT8
    model = onnx.load(str(result.files[FINAL_FILE]))
    dq_outputs = {o for n in model.graph.node if n.op_type == "DequantizeLinear" for o in n.output}
    fed_by_dq = {n.name for n in model.graph.node if set(n.input) & dq_outputs}
    weighted = {n.name for n in model.graph.node if n.op_type in ("Conv", "Gemm")}
    assert not set(auto.exclude) & fed_by_dq  # excluded layers lost their Q/DQ pairs
    assert weighted - set(auto.exclude) <= fed_by_dq  # every other layer kept them


def test_the_demo_plan_is_the_flow_result_and_reapplies_byte_for_byte(demo, tmp_path):
    folder, result = demo
    plan = load_result(folder / "plan.json")
    assert isinstance(plan, AutoResult) and plan.exclude == result.auto.exclude and plan.met
    # `quantdbg apply plan.json model.onnx --data calib.npz` in the demo's folder re-creates its final model.
    again = apply_recipe(folder / "model.onnx", folder / "calib.npz", folder / "plan.json")
    again.save(tmp_path / "again.onnx")
    assert (tmp_path / "again.onnx").read_bytes() == (folder / FINAL_FILE).read_bytes()
    report = load_result(folder / "report.json")
    assert isinstance(report, ReportBundle) and [type(r) for r in report.results] == [AutoResult]
    assert report.results[0].to_dict() == plan.to_dict()
    assert report.summary.rows == tuple((s.name, s.int8_layers, s.top1, s.sqnr_db) for s in result.scores)


def test_the_demo_build_commands_read_the_files_beside_them(demo, tmp_path):
    folder, result = demo
    commands = json.loads((folder / "plan.json").read_text())["plan"]
    assert f"--onnx={folder / FINAL_FILE}" in commands["tensorrt"]["trtexec"]
    # ModelOpt's command reads the files written beside the plan (never a path inside the package),
    # and they are the files `quantdbg demo --export` writes.
    mo = run(commands["modelopt"]["command"], ["python", "-m", "modelopt.onnx.quantization"], modelopt())
    assert (mo.onnx_path, mo.calibration_data_path) == (str(folder / "model.onnx"), str(folder / "calib.npz"))
    assert mo.nodes_to_exclude == list(result.auto.exclude)
    exported = export_demo(tmp_path)
    for name in ("model.onnx", "calib.npz"):
        assert (folder / name).read_bytes() == exported[name].read_bytes()
    # The profile rule of every command: any batch from 1 to the batch size the demo evaluated with (32).
    built = run(commands["tensorrt"]["trtexec"], ["trtexec"], trtexec())
    assert [trtexec_shapes(getattr(built, f"{w}Shapes")) for w in ("min", "opt", "max")] == [
        {INPUT_NAME: (n, 1, 16, 16)} for n in (1, 32, 32)]


def test_run_demo_without_a_folder_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = run_demo(threads=1, min_sqnr_db=30.0)  # the INT8 start already meets 30 dB: no search
    assert result.files == {} and list(tmp_path.iterdir()) == []
    assert result.auto.outcome == "repaired" and result.auto.exclude == () and result.culprits == ()
    assert [(r.repair, r.at_start) for r in result.auto.repairs] == [("calibrator", True)]
    assert dict(result.auto.evaluations) == {"reference": 1, "int8": 1}
    text = result.summary_text()
    assert "top culprit layers" not in text
    assert text.endswith("kept out of INT8 by the fallback search: none\n" + result.auto.message + "\n")


def test_summary_text_is_the_table_the_readme_shows(demo):
    _, result = demo
    scores = (VariantScore("FP32", 0, 536 / 540, math.inf), VariantScore("INT8", 8, 536 / 540, 34.94),
              VariantScore("final", 7, 1.0, 42.81))
    lines = dataclasses.replace(result, scores=scores).summary_text().splitlines()
    assert lines[:4] == ["model     INT8 layers    top-1  logits SQNR vs FP32",
                         "FP32              0/8   99.26%                    -",
                         "INT8              8/8   99.26%              34.9 dB",
                         "final             7/8  100.00%              42.8 dB"]
    start, *repairs = [r for r in result.auto.repairs if r.kept]
    assert start.at_start and not any(r.at_start for r in repairs)
    gate = start.output_sqnr
    first = f"{start.repair} (INT8 start, chosen on the first samples: {gate[0]:.1f} -> {gate[1]:.1f} dB)"
    kept = ", ".join([first] + [f"{r.repair} ({r.before:.1f} -> {r.after:.1f} dB)" for r in repairs])
    culprits = ", ".join(f"{layer.node} {layer.value:.1f} dB" for layer in result.culprits)
    assert kept and lines[4:] == [
        f"INT8 repairs kept: {kept}",
        f"top culprit layers (output SQNR with only that layer in INT8): {culprits}",
        f"kept out of INT8 by the fallback search: {', '.join(result.auto.exclude)}",
        result.auto.message]
