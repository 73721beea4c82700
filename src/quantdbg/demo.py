"""The embedded default model: a small CNN trained on scikit-learn's UCI digits, with its data, and
the demo: :func:`quantdbg.auto` on it, with a printout (``quantdbg demo``).

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
    from quantdbg.config import CalibConfig
    from quantdbg.pipeline import AutoConfig, AutoResult
    from quantdbg.pipeline.records import RepairRecord
    from quantdbg.qdq import QuantizedModel
    from quantdbg.report import ReportBundle
    from quantdbg.sensitivity import LayerSensitivity

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
    # Any: NumPy's stubs check savez's arrays against its keyword allow_pickle (a bool).
    arrays: dict[str, dict[str, Any]] = {"calib.npz": emb.calib,
                                         "eval.npz": {**emb.eval_inputs, LABELS_KEY: emb.labels}}
    for name, content in arrays.items():
        with atomic_file(staged[name]) as tmp, open(tmp, "wb") as stream:
            np.savez(stream, **content)
    write_text_atomic(staged["score.py"], SCORE_SCRIPT)


# --------------------------------------------------------------------------------------------
# The demo: quantdbg.auto on the embedded model, with a printout
# --------------------------------------------------------------------------------------------

DEMO_MIN_SQNR_DB = 42.0
"""The demo's target: logits within 42 dB SQNR of FP32. Default INT8 (entropy) gives about 35 dB, the
calibrator per tensor (the INT8 start) and the INT8 repairs about 41, so the demo shows the whole job:
the INT8 start, repairs, ranking and the fallback search."""

FINAL_FILE = "digits_cnn_final.onnx"
"""The final model :func:`run_demo` writes (mixed precision when layers left INT8)."""

RUN_FILES = ("report.html", "report.md", "report.json", "digits_cnn_int8.onnx", FINAL_FILE, "plan.json",
             *EXPORT_FILES)
"""The files :func:`run_demo` writes, in its folder (those of :func:`export_demo` too): the report, the
INT8 start and the final model, and the flow's result (``plan.json``, what ``quantdbg apply`` reads)."""

_CULPRITS = 3
"""Layers the printout names from the ranking."""


@dataclass(frozen=True)
class VariantScore:
    """One model of the demo on the evaluation set.

    Attributes:
        name: ``"FP32"``, ``"INT8"`` (the INT8 model the flow started from) or ``"final"``.
        int8_layers: Layers computing in INT8.
        top1: Top-1 accuracy against the digit labels.
        sqnr_db: Logits SQNR against FP32 (dB; inf for FP32 itself), as the flow measured it.
    """

    name: str
    int8_layers: int
    top1: float
    sqnr_db: float



def _kept(record: RepairRecord) -> str:
    """A kept repair and what it changed: the output SQNR before and after (the start gate's numbers,
    on the first samples, for a choice made before the first evaluation)."""
    if record.at_start and record.output_sqnr is not None:
        before, after = record.output_sqnr
        return f"{record.repair} (INT8 start, chosen on the first samples: {before:.1f} -> {after:.1f} dB)"
    return f"{record.repair} ({record.before:.1f} -> {record.after:.1f} dB)"


@dataclass(frozen=True)
class DemoResult:
    """What :func:`run_demo` found and wrote.

    Attributes:
        auto: The flow's result: verdict, repairs, ranking, plan with its build commands, final model.
        scores: FP32, the INT8 start and the final model on the evaluation set.
        report: The report: the scores table, then the flow's result.
        files: Files written (:data:`RUN_FILES`), by name; empty when nothing was written.
        seconds: Wall time.
        n_calib_samples: Calibration samples.
        n_eval_samples: Evaluation samples.
    """

    auto: AutoResult
    scores: tuple[VariantScore, ...]
    report: ReportBundle
    files: Mapping[str, Path]
    seconds: float
    n_calib_samples: int
    n_eval_samples: int

    @property
    def culprits(self) -> tuple[LayerSensitivity, ...]:
        """The most sensitive layers of the flow's ranking (none when no ranking was needed)."""
        return () if self.auto.report is None else self.auto.report.layers[:_CULPRITS]

    def summary_text(self) -> str:
        """The table and the flow's decisions (what ``quantdbg demo`` prints)."""
        lines = [f"{'model':<9} {'INT8 layers':>11} {'top-1':>8} {'logits SQNR vs FP32':>20}"]
        for s in self.scores:
            sqnr = "-" if math.isinf(s.sqnr_db) else f"{s.sqnr_db:.1f} dB"
            count = f"{s.int8_layers}/{self.auto.n_layers}"
            lines.append(f"{s.name:<9} {count:>11} {100 * s.top1:>7.2f}% {sqnr:>20}")
        kept = [_kept(r) for r in self.auto.repairs if r.kept and r.after is not None]
        lines.append("INT8 repairs kept: " + (", ".join(kept) or "none"))
        if self.culprits:
            lines.append("top culprit layers (output SQNR with only that layer in INT8): "
                         + ", ".join(f"{layer.node} {layer.value:.1f} dB" for layer in self.culprits))
        lines.append("kept out of INT8 by the fallback search: " + (", ".join(self.auto.exclude) or "none"))
        lines.append(self.auto.message)
        return "\n".join(lines) + "\n"


def run_demo(out_dir: str | os.PathLike | None = None, *, min_sqnr_db: float = DEMO_MIN_SQNR_DB,
             threads: int = 0, progress: bool = False, engine: TrtConfig | None = None) -> DemoResult:
    """Runs :func:`quantdbg.auto` on the embedded digits CNN and scores its models on the digit labels.

    Args:
        out_dir: Existing folder for the report, the models, the flow's result and the files of
            :func:`export_demo` (those the build commands and ``quantdbg apply`` read); None: nothing
            is written.
        min_sqnr_db: The target: logits SQNR against FP32 in dB.
        threads: ONNX Runtime intra-op threads (0: all cores).
        progress: Show progress bars.
        engine: The build commands' TensorRT profile and settings
            (:class:`~quantdbg.backends.tensorrt.TrtConfig`; None: batch 1 to 32, the rule of every
            command).

    Returns:
        The flow's result, the scores table, the report and the files written.

    Raises:
        ConfigError: ``out_dir`` does not exist, or a bad setting.
    """
    from quantdbg.fallback import FallbackTarget
    from quantdbg.pipeline import auto
    from quantdbg.qdq import quantize

    start = time.perf_counter()
    folder = _out_folder(out_dir)
    emb = load_embedded()
    config = _auto_config(threads, progress, engine)
    result = auto(emb.model_path, emb.calib, emb.eval_inputs, FallbackTarget.min_sqnr(min_sqnr_db),
                  config=config)
    # The INT8 model the flow started from (the flow returns only its final model).
    int8 = quantize(emb.model_path, emb.calib, _start_calib(result, config.calib), config.quant)
    scores = _scores(emb, result, int8, threads)
    files = {} if folder is None else {name: folder / name for name in RUN_FILES}
    with commit_together(files) as staged:  # every file appears, or (on a failure) none
        if staged:  # the build commands name the files written beside the result
            result = result.located(files[FINAL_FILE], source=files["model.onnx"],
                                    calibration_data=files["calib.npz"])
            _write_exported(staged, emb)
        report = _report(scores, result, min_sqnr_db)
        _write(staged, report, int8, result)
    return DemoResult(result, scores, report, files, round(time.perf_counter() - start, 2),
                      len(emb.calib[INPUT_NAME]), len(emb.labels))


def _start_calib(result: AutoResult, calib: CalibConfig) -> CalibConfig:
    """The calibration of the flow's INT8 start: ``calib``, with the calibrator choice if it was the start."""
    from quantdbg.pipeline.repairs import with_per_tensor

    start = result.recipe.start_choice
    return calib if start is None else with_per_tensor(calib, {c.tensor: c.calibrator for c in start.changes})


def _auto_config(threads: int, progress: bool, engine: TrtConfig | None) -> AutoConfig:
    """The flow's settings: an isolated ranking (on 8 layers, 9 passes ranking by the target's own metric)."""
    from quantdbg.fallback import FallbackConfig
    from quantdbg.pipeline import AutoConfig
    from quantdbg.sensitivity import SensitivityConfig

    return AutoConfig(fallback=FallbackConfig(SensitivityConfig(mode="isolated")), threads=threads,
                      progress=progress, engine=engine)


def _out_folder(out_dir: str | os.PathLike | None) -> Path | None:
    if out_dir is None:
        return None
    folder = Path(out_dir)
    if not folder.is_dir():
        raise ConfigError(f"Output folder {str(folder)!r} does not exist; create it first.")
    return folder


def _scores(emb: EmbeddedModel, result: AutoResult, int8: QuantizedModel,
            threads: int) -> tuple[VariantScore, ...]:
    """FP32, the INT8 start and final model: top-1 on the evaluation set; the flow's logits SQNR."""
    from quantdbg.backends import OnnxrtRunner, OrtConfig
    from quantdbg.evaluation import Accuracy

    assert result.model is not None  # a run always ends with a model
    accuracy = Accuracy(emb.labels, OUTPUT_NAME)
    models = (str(emb.model_path), int8.model, result.model.model)
    outputs = []
    for model in models:
        with OnnxrtRunner(model, OrtConfig(intra_op_num_threads=threads)) as runner:
            outputs.append(runner.infer(emb.eval_inputs))
    top1 = [accuracy.from_outputs(out, outputs[0]) for out in outputs]
    n = result.n_layers
    return (VariantScore("FP32", 0, top1[0], result.fp32_value),
            VariantScore("INT8", n, top1[1], result.int8_value),
            VariantScore("final", n - len(result.exclude), top1[2], result.final_value))


def _report(scores: tuple[VariantScore, ...], result: AutoResult, min_sqnr_db: float) -> ReportBundle:
    from quantdbg.diagnostics import Evidence
    from quantdbg.report import ReportBundle

    summary = Evidence(("model", "layers in INT8", "top-1", "logits SQNR vs FP32 (dB)"),
                       tuple((s.name, s.int8_layers, s.top1, s.sqnr_db) for s in scores))
    note = (f"quantdbg.auto on the embedded digits CNN (scikit-learn's UCI digits, {result.n_layers} "
            f"quantizable layers), target logits SQNR >= {min_sqnr_db:g} dB: entropy calibration, the INT8 "
            "repairs, a ranking of the layers (isolated: only that layer in INT8), then the fewest layers "
            "kept out of INT8. INT8 is the INT8 model the flow started from; top-1 is against "
            "the digit labels.")
    return ReportBundle("quantdbg demo: digits CNN", (result,), summary, (note,))


def _write(staged: Mapping[str, Path], report: ReportBundle, int8: QuantizedModel,
           result: AutoResult) -> None:
    """Writes the report, both models and the flow's result at their ``staged`` paths (none: nothing)."""
    if not staged:
        return
    from quantdbg.report import write_report

    assert result.model is not None
    write_report(report, html=staged["report.html"], markdown=staged["report.md"], json=staged["report.json"])
    int8.save(staged["digits_cnn_int8.onnx"])
    result.model.save(staged[FINAL_FILE])
    result.write(staged["plan.json"])


__all__ = ["DEMO_MIN_SQNR_DB", "EXPORT_FILES", "FINAL_FILE", "INPUT_NAME", "OUTPUT_NAME", "RUN_FILES",
           "DemoResult", "EmbeddedModel", "VariantScore", "export_demo", "load_embedded", "preprocess_digits",
           "run_demo"]
