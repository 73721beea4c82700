"""Models and data for the automatic flow's tests.

* :func:`clipped_mlp` with :func:`clipped_inputs`: 2 % of the samples carry +-40 on one input channel,
  the rest is standard normal, so the entropy calibrator clips the input at about 3 and those
  samples (which dominate the output energy) saturate; minmax keeps them.
* :func:`planted_cnn`: the small CNN whose ``conv2`` weights carry one 60.0 per output channel,
  read from an input channel that is almost zero, so the per-channel weight scale rounds every
  useful weight of ``conv2`` to zero; no calibrator can repair that, only keeping ``conv2`` out
  of INT8 can.
"""
from __future__ import annotations

import shlex
import sys
from pathlib import Path

import models
import models_sensitivity
import numpy as np
import onnx
from onnx import numpy_helper

from quantdbg.pipeline import CalibratorRepairConfig

PLANTED = "conv2"
NO_START = CalibratorRepairConfig(start_sqnr_gain=None)
"""The calibrator choice as a repair only: the default calibration is always the INT8 start."""


def clipped_inputs(rng: np.random.Generator, n: int = 256) -> dict[str, np.ndarray]:
    """``{"x": [n, 8]}``: standard normal, with channel 3 of every 50th sample (random) at +-40."""
    x = rng.standard_normal((n, 8)).astype(np.float32)
    rows = rng.choice(n, n // 50, replace=False)
    x[rows, 3] = 40.0 * np.sign(rng.standard_normal(rows.size)).astype(np.float32)
    return {"x": x}


def clipped_mlp() -> onnx.ModelProto:
    """``models.mlp()``: Gemm(8->16) -> Relu -> MatMul(16->4) -> Add (the input is what clips)."""
    return models.mlp()


def _set(model: onnx.ModelProto, name: str, change) -> None:  # noqa: ANN001
    for init in model.graph.initializer:
        if init.name == name:
            init.CopyFrom(numpy_helper.from_array(change(numpy_helper.to_array(init).copy()), name))


def planted_cnn() -> onnx.ModelProto:
    """``models_sensitivity.small_cnn()`` with ``conv2`` planted (see the module docstring)."""
    model = models_sensitivity.small_cnn()

    def quiet_channel(w: np.ndarray) -> np.ndarray:
        w[0] *= 1e-3  # conv1's output channel 0 is almost zero ...
        return w

    def outlier(w: np.ndarray) -> np.ndarray:
        w[:, 0, 1, 1] = 60.0  # ... and conv2 reads it with a weight that sets every channel's scale
        return w

    _set(model, "conv1.w", quiet_channel)
    _set(model, "conv2.w", outlier)
    return model


def planted_classifier(evals: dict[str, np.ndarray]) -> tuple[onnx.ModelProto, np.ndarray]:
    """:func:`planted_cnn` with ``fc``'s bias centring its logits on ``evals`` (so INT8's error flips
    classes), and the FP32 model's classes of ``evals`` as labels (FP32 accuracy 1.0)."""
    model = planted_cnn()
    (logits,) = models_sensitivity.run_exposed(model, [evals], ["y"])["y"]
    fc = next(n for n in model.graph.node if n.name == "fc")
    model.graph.initializer.append(numpy_helper.from_array(-logits.mean(0).astype(np.float32), "fc.b"))
    fc.input.append("fc.b")
    (logits,) = models_sensitivity.run_exposed(model, [evals], ["y"])["y"]
    return model, logits.argmax(-1)


def cnn_inputs(rng: np.random.Generator, n: int = 64) -> dict[str, np.ndarray]:
    """``{"x": [n, 3, 8, 8]}`` standard normal."""
    return {"x": rng.standard_normal((n, 3, 8, 8)).astype(np.float32)}


def relative_accuracy(outputs: dict[str, np.ndarray], reference: dict[str, np.ndarray]) -> float:
    """1 - ||y - y_fp32|| / ||y_fp32|| over every output (1.0 for the FP32 model)."""
    error = sum(float(np.sum((outputs[k].astype(np.float64) - reference[k]) ** 2)) for k in reference)
    energy = sum(float(np.sum(reference[k].astype(np.float64) ** 2)) for k in reference)
    return 1.0 - float(np.sqrt(error / energy))


SCORE_SCRIPT = """\
import sys
import numpy as np
import onnxruntime as ort
x = np.load(sys.argv[2])["x"]
ref = np.load(sys.argv[3])["y"]
out = ort.InferenceSession(sys.argv[1], providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
print(1 - np.linalg.norm(out - ref) / np.linalg.norm(ref))
"""
"""An evaluation command's script: 1 - ||y - y_fp32|| / ||y_fp32|| on eval.npz (1.0 for the FP32 model)."""


def write_task_files(folder: Path, model: onnx.ModelProto, calib: dict[str, np.ndarray],
                     evals: dict[str, np.ndarray]) -> Path:
    """Writes ``fp32.onnx``, ``calib.npz``, ``eval.npz``, the FP32 outputs ``ref.npz`` and ``score.py``."""
    import onnxruntime as ort

    onnx.save(model, str(folder / "fp32.onnx"))
    np.savez(folder / "calib.npz", **calib)
    np.savez(folder / "eval.npz", **evals)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    np.savez(folder / "ref.npz", y=session.run(None, evals)[0])
    (folder / "score.py").write_text(SCORE_SCRIPT)
    return folder


def score_command(folder: Path) -> str:
    """The ``--evaluate`` command scoring ``{model}`` with the files of :func:`write_task_files`."""
    return " ".join(shlex.quote(str(a)) for a in (sys.executable, folder / "score.py")) + \
        f" {{model}} {shlex.quote(str(folder / 'eval.npz'))} {shlex.quote(str(folder / 'ref.npz'))}"


def record_scales(qmodel) -> list[tuple[str, int, bytes]]:  # noqa: ANN001
    """Each Q/DQ record's (node, input, scale bytes): two quantized models with equal scales, exactly."""
    return [(r.node, r.input_index, np.asarray(r.scale, np.float32).tobytes()) for r in qmodel.records]
