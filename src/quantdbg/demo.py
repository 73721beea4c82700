"""The embedded default model: a small CNN trained on scikit-learn's UCI digits, with its data.

The package ships ``_data/digits_cnn.onnx`` (trained by ``examples/train_digits.py``) and
``_data/digits.npz``, which stores the raw 8x8 scans as uint8 (0..16) to stay small; the
preprocessing that turns them into model inputs lives here, in NumPy, so no deep-learning
framework is needed at run time.
"""
from __future__ import annotations

import math
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from quantdbg._io import atomic_file, commit_together, write_bytes_atomic, write_text_atomic
from quantdbg.errors import ConfigError, DataError, ModelError

if TYPE_CHECKING:
    from quantdbg.backends.tensorrt import TrtConfig

INPUT_NAME = "input"
OUTPUT_NAME = "logits"
UPSCALE = 2
"""8x8 scans are upscaled to 16x16 (nearest neighbour) so the CNN has room for two poolings."""
_MODEL_FILE = "digits_cnn.onnx"
_DATA_FILE = "digits.npz"


@dataclass(frozen=True)
class EmbeddedModel:
    """The embedded digits CNN and its data, ready to calibrate and evaluate.

    Attributes:
        model_path: The FP32 ONNX model (input ``input`` [N,1,16,16] float32, output ``logits`` [N,10]).
        calib: Calibration inputs: ``{"input": float32 [256,1,16,16]}`` (training images).
        eval_inputs: Held-out evaluation inputs: ``{"input": float32 [540,1,16,16]}``.
        labels: int64 [540] digit labels of ``eval_inputs``.
    """

    model_path: Path
    calib: dict[str, np.ndarray]
    eval_inputs: dict[str, np.ndarray]
    labels: np.ndarray


def preprocess_digits(pixels: np.ndarray) -> np.ndarray:
    """Turns raw digits scans into model inputs.

    Args:
        pixels: [N,8,8] intensities in 0..16 (any numeric dtype), as scikit-learn's
            ``load_digits().images``.

    Returns:
        float32 [N,1,16,16]: each pixel repeated 2x2, scaled to [-1, 1].

    Raises:
        DataError: ``pixels`` is not [N,8,8].
    """
    pixels = np.asarray(pixels)
    if pixels.ndim != 3 or pixels.shape[1:] != (8, 8):
        raise DataError(f"Digits scans must have shape [N,8,8], got {pixels.shape}.")
    x = pixels.astype(np.float32) / np.float32(16.0)
    x = np.repeat(np.repeat(x, UPSCALE, axis=1), UPSCALE, axis=2)
    return ((x - np.float32(0.5)) / np.float32(0.5))[:, None]


def _resource(name: str) -> Path:
    ref = resources.files("quantdbg").joinpath("_data").joinpath(name)
    path = Path(str(ref))
    if not path.is_file():
        raise ModelError(
            f"The embedded file {name!r} is missing from the quantdbg package (looked at {str(path)!r}). "
            "Reinstall quantdbg, or regenerate it with examples/train_digits.py."
        )
    return path


def load_embedded() -> EmbeddedModel:
    """Returns the embedded digits CNN with its calibration and evaluation data.

    Returns:
        The model path and preprocessed arrays; the arrays are new on every call.

    Raises:
        ModelError: The package's data files are missing (a broken install).
    """
    model_path = _resource(_MODEL_FILE)
    with np.load(_resource(_DATA_FILE), allow_pickle=False) as data:
        calib = preprocess_digits(data["calib_pixels"])
        evals = preprocess_digits(data["eval_pixels"])
        labels = data["eval_labels"].astype(np.int64)
    return EmbeddedModel(model_path, {INPUT_NAME: calib}, {INPUT_NAME: evals}, labels)


# --------------------------------------------------------------------------------------------
# The files README's commands use
# --------------------------------------------------------------------------------------------

LABELS_KEY = "labels"
"""The array of ``eval.npz`` holding the digit labels (``--labels labels``), beside the model input."""

SCORE_SCRIPT = '''\
"""Top-1 accuracy of a digits model on eval.npz (next to this script); prints one number.

Usage: python score.py MODEL.onnx    (quantdbg's --evaluate 'python score.py {model}')
"""
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort

data = np.load(Path(__file__).with_name("eval.npz"))
session = ort.InferenceSession(sys.argv[1], providers=["CPUExecutionProvider"])
logits = session.run(None, {"input": data["input"]})[0]
print(float((logits.argmax(axis=1) == data["labels"]).mean()))
'''
"""The sample evaluation command ``export_demo`` writes: a task metric the way ``--evaluate`` reads it."""


EXPORT_FILES = ("model.onnx", "calib.npz", "eval.npz", "score.py")
"""The files :func:`export_demo` writes, in its folder."""


def export_demo(out_dir: str | os.PathLike) -> dict[str, Path]:
    """Writes the embedded model, its data and a sample evaluation script, so the commands of the
    README run as written. The four files appear together or not at all.

    Files: ``model.onnx`` (the FP32 digits CNN), ``calib.npz`` (``input``: float32 [256,1,16,16]),
    ``eval.npz`` (``input``: float32 [540,1,16,16] and ``labels``: int64 [540]) and ``score.py``
    (``python score.py MODEL.onnx`` prints the top-1 accuracy of MODEL on eval.npz).

    Args:
        out_dir: Existing folder (files of these names in it are replaced).

    Returns:
        File name -> path written.

    Raises:
        ConfigError: ``out_dir`` does not exist.
        OutputError: A file cannot be written (none was).
    """
    folder = _out_folder(out_dir)
    assert folder is not None
    files = {name: folder / name for name in EXPORT_FILES}
    with commit_together(files) as staged:  # private folders: each file moves into place at the end
        _write_exported(staged, load_embedded())
    return files


def _write_exported(staged: Mapping[str, Path], emb: EmbeddedModel) -> None:
    """Writes the files of :func:`export_demo` at their ``staged`` paths."""
    write_bytes_atomic(staged["model.onnx"], emb.model_path.read_bytes())
    arrays: dict[str, dict[str, Any]] = {"calib.npz": emb.calib,
                                         "eval.npz": {**emb.eval_inputs, LABELS_KEY: emb.labels}}
    for name, content in arrays.items():
        with atomic_file(staged[name]) as tmp, open(tmp, "wb") as stream:
            np.savez(stream, **content)
    write_text_atomic(staged["score.py"], SCORE_SCRIPT)


# --------------------------------------------------------------------------------------------
# The whole job in one call
# --------------------------------------------------------------------------------------------

DEMO_MIN_SQNR_DB = 42.0
"""The demo's fallback target: logits within 42 dB SQNR of FP32 (entropy INT8 gives about 35)."""


@dataclass(frozen=True)
class VariantScore:
    """One variant of the embedded model on the evaluation set.

    Attributes:
        name: ``"FP32"``, ``"INT8"`` or ``"mixed"``.
        int8_layers: Layers computing in INT8.
        top1: Top-1 accuracy against the labels.
        sqnr_db: Logits SQNR against FP32 (dB; inf for FP32 itself).
    """

    name: str
    int8_layers: int
    top1: float
    sqnr_db: float


@dataclass(frozen=True)
class DemoResult:
    """What :func:`run_demo` measured and wrote.

    Attributes:
        scores: FP32, INT8 and mixed precision on the evaluation set.
        n_layers: Quantizable layers of the model.
        culprits: Most sensitive layers (isolated ranking), with their isolated output SQNR (dB).
        excluded: Layers the fallback plan keeps out of INT8.
        bundle: Every result, ready for :mod:`quantdbg.report`.
        files: Files written (report.html/.md/.json, the INT8 and mixed models, the plan, and the
            files of :func:`export_demo` its build commands read), by name.
        seconds: Wall time.
        n_calib_samples: Calibration samples.
        n_eval_samples: Evaluation samples.
    """

    scores: tuple[VariantScore, ...]
    n_layers: int
    culprits: tuple[tuple[str, float], ...]
    excluded: tuple[str, ...]
    bundle: Any
    files: Mapping[str, Path]
    seconds: float
    n_calib_samples: int = 0
    n_eval_samples: int = 0

    def summary_text(self) -> str:
        """A short table of the results (what ``quantdbg demo`` prints)."""
        lines = [f"{'model':<9} {'INT8 layers':>11} {'top-1':>8} {'logits SQNR vs FP32':>20}"]
        for s in self.scores:
            sqnr = "-" if math.isinf(s.sqnr_db) else f"{s.sqnr_db:.1f} dB"
            count = f"{s.int8_layers}/{self.n_layers}"
            lines.append(f"{s.name:<9} {count:>11} {100 * s.top1:>7.2f}% {sqnr:>20}")
        lines.append("top culprit layers (output SQNR with only that layer in INT8): "
                     + ", ".join(f"{name} {value:.1f} dB" for name, value in self.culprits))
        lines.append("kept out of INT8 by the fallback search: " + (", ".join(self.excluded) or "none"))
        return "\n".join(lines) + "\n"


def _top1(model: Any, inputs: Mapping[str, np.ndarray], labels: np.ndarray,
          threads: int) -> tuple[float, np.ndarray]:
    from quantdbg.backends import OnnxrtRunner, OrtConfig

    with OnnxrtRunner(model, OrtConfig(intra_op_num_threads=threads)) as runner:
        logits = runner.infer(inputs)[OUTPUT_NAME]
    return float((logits.argmax(axis=1) == labels).mean()), logits


def run_demo(out_dir: str | os.PathLike | None = None, *, min_sqnr_db: float = DEMO_MIN_SQNR_DB,
             threads: int = 0, progress: bool = False, engine: TrtConfig | None = None) -> DemoResult:
    """Calibrates, analyzes, falls back and reports on the embedded digits CNN.

    Args:
        out_dir: Existing folder for the report and models, and the files of :func:`export_demo`
            (the FP32 model and calibration data ModelOpt's command reads; None: nothing is written).
        min_sqnr_db: Fallback target: logits SQNR against FP32 in dB.
        threads: ONNX Runtime intra-op threads (0: all cores).
        progress: Show progress bars.
        engine: The build commands' TensorRT profile and settings
            (:class:`~quantdbg.backends.tensorrt.TrtConfig`; None: batch 1 to 32, the rule of every
            command).

    Returns:
        The scores, culprits, layers kept out of INT8, the report bundle and the files written.

    Raises:
        ConfigError: ``out_dir`` does not exist.
    """
    from quantdbg.backends import OnnxrtRunnerFactory, OrtConfig
    from quantdbg.data import DEFAULT_BATCH_SIZE
    from quantdbg.diagnostics import DoctorConfig, diagnose
    from quantdbg.fallback import FallbackConfig, FallbackTarget, auto_fallback
    from quantdbg.qdq import quantize
    from quantdbg.sensitivity import SensitivityConfig, VariantEvaluator

    start = time.perf_counter()
    folder = _out_folder(out_dir)
    emb = load_embedded()
    qmodel = quantize(emb.model_path, emb.calib, progress=progress)
    factory = OnnxrtRunnerFactory(OrtConfig(intra_op_num_threads=threads))
    # Isolated ranking: on 8 layers it costs 9 passes and ranks by the very metric of the target.
    config = FallbackConfig(SensitivityConfig(mode="isolated", progress=progress))
    with VariantEvaluator(emb.model_path, qmodel, emb.eval_inputs, runner_factory=factory) as evaluator:
        found = auto_fallback(evaluator, FallbackTarget.min_sqnr(min_sqnr_db), config)
    plan, ranking = found.plan, found.report
    mixed = found.mixed if found.mixed is not None else qmodel
    doctor = diagnose(emb.model_path, emb.calib, emb.eval_inputs, DoctorConfig(threads=threads),
                      progress=progress)
    n_layers = len(qmodel.layers)
    scores = _scores(emb, qmodel.model, mixed.model, n_layers, len(mixed.excluded), threads)
    files = {} if folder is None else {name: folder / name for name in RUN_FILES}
    with commit_together(files) as staged:  # every file appears, or (on a failure) none
        if staged:  # the build commands name the files written beside the plan
            mixed.save(staged[MIXED_FILE])
            _write_exported(staged, emb)
            plan = plan.with_build(files[MIXED_FILE], emb.eval_inputs, config=engine,
                                   batch_size=DEFAULT_BATCH_SIZE, source=files["model.onnx"],
                                   calibration_data=files["calib.npz"], graph=staged[MIXED_FILE])
        bundle = _bundle(scores, ranking, plan, qmodel.calibration, doctor, min_sqnr_db)
        _write(staged, bundle, qmodel, plan)
    culprits = tuple((layer.node, layer.value) for layer in ranking.layers[:3])
    return DemoResult(scores, n_layers, culprits, tuple(mixed.excluded), bundle, files,
                      round(time.perf_counter() - start, 2), len(emb.calib[INPUT_NAME]), len(emb.labels))


MIXED_FILE = "digits_cnn_mixed.onnx"
RUN_FILES = ("report.html", "report.md", "report.json", "digits_cnn_int8.onnx", MIXED_FILE,
             "fallback_plan.json", *EXPORT_FILES)
"""The files :func:`run_demo` writes, in its folder (those of :func:`export_demo` too)."""


def _out_folder(out_dir: str | os.PathLike | None) -> Path | None:
    if out_dir is None:
        return None
    folder = Path(out_dir)
    if not folder.is_dir():
        raise ConfigError(f"Output folder {str(folder)!r} does not exist; create it first.")
    return folder


def _scores(emb: EmbeddedModel, int8: Any, mixed: Any, n_layers: int, n_excluded: int,
            threads: int) -> tuple[VariantScore, ...]:
    """FP32, INT8 and mixed precision: top-1 on the evaluation set, and logits SQNR against FP32."""
    from quantdbg.evaluation import compare_arrays

    fp_top1, ref = _top1(str(emb.model_path), emb.eval_inputs, emb.labels, threads)
    found = [VariantScore("FP32", 0, fp_top1, math.inf)]
    for name, model, count in (("INT8", int8, n_layers), ("mixed", mixed, n_layers - n_excluded)):
        top1, logits = _top1(model, emb.eval_inputs, emb.labels, threads)
        found.append(VariantScore(name, count, top1, float(compare_arrays(ref, logits).sqnr_db)))
    return tuple(found)


def _bundle(scores: tuple[VariantScore, ...], ranking: Any, plan: Any, calibration: Any, doctor: Any,
            min_sqnr_db: float) -> Any:
    from quantdbg.diagnostics import Evidence
    from quantdbg.report import ReportBundle

    summary = Evidence(("model", "layers in INT8", "top-1", "logits SQNR vs FP32 (dB)"),
                       tuple((s.name, s.int8_layers, s.top1, s.sqnr_db) for s in scores))
    notes = (f"The embedded digits CNN (scikit-learn's UCI digits, {len(ranking.layers)} quantizable layers) "
             "calibrated with the entropy calibrator, ranked layer by layer (isolated: only that layer in "
             "INT8), then searched for the smallest set of layers to keep out of INT8 (in FP16) reaching "
             f"logits SQNR >= {min_sqnr_db:g} dB.",
             plan.message)
    return ReportBundle("quantdbg demo: digits CNN", (calibration, ranking, plan, doctor), summary, notes)


def _write(staged: Mapping[str, Path], bundle: Any, qmodel: Any, plan: Any) -> None:
    """Writes the report, the INT8 model and the plan at their ``staged`` paths (none: nothing)."""
    if not staged:
        return
    from quantdbg.report import write_report

    write_report(bundle, html=staged["report.html"], markdown=staged["report.md"], json=staged["report.json"])
    qmodel.save(staged["digits_cnn_int8.onnx"])
    plan.write(staged["fallback_plan.json"])
