"""End to end through ONNX Runtime: quantize, rank, fall back, and check the written model independently."""
from __future__ import annotations

import json

import models_sensitivity as ms
import numpy as np
import onnx
import onnxruntime as ort
import pytest

import quantdbg
from quantdbg.backends import OnnxrtRunnerFactory, OrtConfig
from quantdbg.cli import main
from quantdbg.config import CalibConfig, Precision
from quantdbg.evaluation import Accuracy
from quantdbg.fallback import FallbackConfig, FallbackTarget, auto_fallback
from quantdbg.qdq import records_from_model
from quantdbg.sensitivity import VariantEvaluator, analyze_sensitivity

ONE_THREAD = OnnxrtRunnerFactory(OrtConfig(intra_op_num_threads=1))


def _run(path, feeds):
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.add_session_config_entry("session.disable_quant_qdq", "1")  # Q/DQ as ONNX defines it
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return np.concatenate([session.run(None, dict(f))[0] for f in feeds])


def test_cli_fallback_model_meets_its_target_when_rerun(tmp_path, rng):
    """The mixed model written by `quantdbg fallback` is re-scored here with plain ONNX Runtime."""
    model = ms.small_cnn()
    feeds = ms.feeds_for(model, rng, batches=4, batch=8)
    onnx.save(model, str(tmp_path / "fp32.onnx"))
    x = np.concatenate([f["x"] for f in feeds])
    np.savez(tmp_path / "calib.npz", x=x[:16])
    np.savez(tmp_path / "eval.npz", x=x[16:])
    code = main(["fallback", str(tmp_path / "fp32.onnx"), "--data", str(tmp_path / "calib.npz"), "--eval",
                 str(tmp_path / "eval.npz"), "--method", "minmax", "--min-sqnr", "35", "--out",
                 str(tmp_path / "mixed.onnx"), "--plan", str(tmp_path / "plan.json")])
    plan = json.loads((tmp_path / "plan.json").read_text())
    assert code == 0, plan["message"]
    ref = _run(tmp_path / "fp32.onnx", [{"x": x[16:]}]).astype(np.float64)
    got = _run(tmp_path / "mixed.onnx", [{"x": x[16:]}]).astype(np.float64)
    assert 10 * np.log10((ref**2).sum() / ((got - ref) ** 2).sum()) >= 35
    mixed = records_from_model(tmp_path / "mixed.onnx")
    assert set(mixed.layers).isdisjoint(plan["exclude"])
    assert len(mixed.layers) + len(plan["exclude"]) == len(plan["ranking"])


@pytest.mark.zoo
@pytest.mark.slow
def test_digits_cnn_flow(zoo_model, tmp_path):
    folder = zoo_model("digits_cnn")
    evals = np.load(folder / "eval.npz")
    qmodel = quantdbg.quantize(folder / "model.onnx", folder / "calib.npz", CalibConfig(method="minmax"))
    data = {"input": evals["input"]}
    accuracy = Accuracy(evals["label"])
    local = analyze_sensitivity(folder / "model.onnx", qmodel, data, runner_factory=ONE_THREAD)
    assert sorted(local.ranking) == sorted(qmodel.layers)
    fp32_accuracy = float(np.mean(_run(folder / "model.onnx", [data]).argmax(1) == evals["label"]))
    target = FallbackTarget.min_metric(fp32_accuracy - 0.002)
    with VariantEvaluator(folder / "model.onnx", qmodel, data, accuracy, ONE_THREAD) as evaluator:
        result = auto_fallback(evaluator, target, FallbackConfig(precision=Precision.FP32), report=local)
    assert result.plan.status == "met"
    assert result.plan.n_evaluations <= result.plan.budget
    result.mixed.save(tmp_path / "mixed.onnx")
    rerun = float(np.mean(_run(tmp_path / "mixed.onnx", [data]).argmax(1) == evals["label"]))
    assert rerun >= target.threshold
