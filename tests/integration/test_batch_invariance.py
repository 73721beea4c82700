"""Scales and statistics (sample peaks included) do not depend on batch size or order: batches of 1, 7 or 64,
shuffled, on real models."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import models
import numpy as np
import onnx
import onnxruntime as ort
import pytest

from quantdbg.calibration import calibrate
from quantdbg.calibration.stats import SamplePeak, TensorStats
from quantdbg.config import CalibConfig
from quantdbg.data import ArrayData, load_npz
from quantdbg.demo import load_embedded
from quantdbg.model.specs import input_specs

METHODS = ("minmax", "entropy", "percentile", "mse")


def _opts() -> ort.SessionOptions:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    return options


def _embedded() -> tuple[Path, dict[str, np.ndarray]]:
    embedded = load_embedded()  # package data: its absence is a broken install, a failure here
    return embedded.model_path, embedded.calib


def _small(builder, shape: tuple[int, ...], n: int = 96) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    rng = np.random.default_rng(1)
    spread = rng.uniform(0.1, 3.0, (n,) + (1,) * len(shape))  # samples of very different ranges
    return builder(), {"x": (rng.standard_normal((n, *shape)) * spread).astype(np.float32)}


def _assert_batch_invariant(model, arrays: dict[str, np.ndarray], method: str) -> None:
    n = next(iter(arrays.values())).shape[0]
    order = np.random.default_rng(7).permutation(n)
    shuffled = {k: v[order] for k, v in arrays.items()}
    runs = {}
    for label, source, batch in (("1", arrays, 1), ("7", arrays, 7), ("64", arrays, 64),
                                 ("7-shuffled", shuffled, 7), ("all-shuffled", shuffled, None)):
        runs[label] = calibrate(model, ArrayData(source, batch), CalibConfig(method=method),
                                session_options=_opts())
    reference = runs["1"]
    assert reference.n_batches == n and runs["64"].n_batches == -(-n // 64)
    for label, result in runs.items():
        assert result.n_samples == n
        assert dict(result.scales()) == dict(reference.scales()), f"{method}: batches {label} differ"
        # Peaks name samples by position (among equal peaks, the earliest): shuffling renames them.
        got, want = (_unnamed(r.stats) if "shuffled" in label else dict(r.stats) for r in (result, reference))
        assert got == want, f"{method}: statistics of batches {label} differ"
    _assert_peaks(reference.stats, arrays)


def _unnamed(stats) -> dict[str, TensorStats]:
    """The statistics with the peaks' sample indices left out."""
    return {k: replace(s, peaks=tuple(SamplePeak(-1, p.absmax) for p in s.peaks)) for k, s in stats.items()}


def _assert_peaks(stats, arrays: dict[str, np.ndarray]) -> None:
    """Every tensor keeps the two samples with the largest max |x|; the inputs' against NumPy."""
    assert all(len(s.peaks) == 2 for s in stats.values()), {k: s.peaks for k, s in stats.items()}
    for name, array in arrays.items():
        if name in stats:
            per_sample = np.abs(array.reshape(array.shape[0], -1)).max(axis=1)
            top = np.argsort(-per_sample, kind="stable")[:2]
            assert stats[name].peaks == tuple(SamplePeak(int(i), float(per_sample[i])) for i in top)


@pytest.mark.parametrize("method", METHODS)
def test_embedded_digits_cnn(method):
    model, arrays = _embedded()
    _assert_batch_invariant(model, arrays, method)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("name, shape", [("conv_residual", (4, 8, 8)), ("concat_convs", (3, 8, 8)),
                                         ("mlp", (8,)), ("attention_matmuls", (5, 8))])
def test_small_models(name, shape, method):
    model, arrays = _small(getattr(models, name), shape)
    _assert_batch_invariant(model, arrays, method)


@pytest.mark.zoo
@pytest.mark.slow
@pytest.mark.parametrize("method", METHODS)
def test_zoo_digits_cnn(zoo_model, method):
    folder = zoo_model("digits_cnn")
    model = onnx.load(str(folder / "model.onnx"))
    arrays = load_npz(folder / "calib.npz", None, limit=128, inputs=list(input_specs(model))).arrays
    _assert_batch_invariant(folder / "model.onnx", {k: v[:128] for k, v in arrays.items()}, method)
