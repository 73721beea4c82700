"""The digits CNN end to end: INT8 (entropy) Q/DQ through ONNX Runtime keeps FP32 top-1 accuracy."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from quantdbg.backends import OnnxrtRunner, OrtConfig
from quantdbg.config import CalibConfig, Precision
from quantdbg.data import load_npz
from quantdbg.model import load_model
from quantdbg.qdq import QuantizedModel, quantize, remove_qdq

ONE_THREAD = OrtConfig(intra_op_num_threads=1)
MAX_DROP_POINTS = 0.5


def top1(model, inputs: dict[str, np.ndarray], labels: np.ndarray) -> float:
    with OnnxrtRunner(model, ONE_THREAD) as runner:
        logits = next(iter(runner.infer(inputs).values()))
    return 100.0 * float((logits.argmax(axis=1) == labels).mean())


def check_int8_keeps_accuracy(model_path: Path, calib, inputs: dict[str, np.ndarray],
                              labels: np.ndarray) -> QuantizedModel:
    fp32 = top1(str(model_path), inputs, labels)
    qm = quantize(model_path, calib, CalibConfig(method="entropy"))
    int8 = top1(qm.model, inputs, labels)
    assert fp32 > 90.0
    assert int8 >= fp32 - MAX_DROP_POINTS
    # Every Conv and Gemm is quantized on both inputs; the residual Add (if any) on one input.
    ops = {n.name: n.op_type for n in load_model(model_path).graph.node}
    quantized = {(r.node, r.input_index) for r in qm.records}
    for name, op in ops.items():
        if op in ("Conv", "Gemm"):
            assert {(name, 0), (name, 1)} <= quantized
    for name in (n for n, op in ops.items() if op == "Add"):
        assert len([r for r in qm.records if r.node == name]) == 1
    return qm


def test_embedded_digits_int8_entropy_within_half_a_point():
    from quantdbg.demo import load_embedded

    embedded = load_embedded()
    qm = check_int8_keeps_accuracy(embedded.model_path, embedded.calib, embedded.eval_inputs, embedded.labels)
    # Falling back every layer in FP32 gives the FP32 model's predictions back exactly.
    back = remove_qdq(qm, qm.layers, Precision.FP32)
    with OnnxrtRunner(back.model, ONE_THREAD) as a, OnnxrtRunner(str(embedded.model_path), ONE_THREAD) as b:
        np.testing.assert_array_equal(a.infer(embedded.eval_inputs)["logits"],
                                      b.infer(embedded.eval_inputs)["logits"])


@pytest.mark.zoo
def test_zoo_digits_int8_entropy_within_half_a_point(zoo_model):
    folder = zoo_model("digits_cnn")
    evaluation = np.load(folder / "eval.npz", allow_pickle=False)
    calib = load_npz(folder / "calib.npz", inputs=["input"])
    check_int8_keeps_accuracy(folder / "model.onnx", calib, {"input": evaluation["input"]},
                              evaluation["label"])
