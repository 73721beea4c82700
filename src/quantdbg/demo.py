"""The embedded default model: a small CNN trained on scikit-learn's UCI digits, with its data.

The package ships ``_data/digits_cnn.onnx`` (trained by ``examples/train_digits.py``) and
``_data/digits.npz``, which stores the raw 8x8 scans as uint8 (0..16) to stay small; the
preprocessing that turns them into model inputs lives here, in NumPy, so no deep-learning
framework is needed at run time.
"""
from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numpy as np

from quantdbg.errors import DataError, ModelError

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
    ref = resources.files("quantdbg").joinpath("_data", name)
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
