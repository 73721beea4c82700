"""Malformed data files give one DataError naming the file, before anything is allocated or written."""
from __future__ import annotations

import hashlib
import io
import warnings
import zipfile

import models_sensitivity as ms
import numpy as np
import onnx
import pytest

from quantdbg.cli import main
from quantdbg.config import CalibConfig
from quantdbg.data import load_npz, read_npz
from quantdbg.errors import DataError, QuantDbgWarning
from quantdbg.qdq import quantize


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("data")
    rng = np.random.default_rng(0)
    model = ms.mlp4()
    onnx.save(model, str(folder / "m.onnx"))
    x = rng.standard_normal((8, 16)).astype(np.float32)
    np.savez(folder / "calib.npz", x=x)
    np.savez(folder / "labels.npz", x=x, label=np.array([object()] * 8, dtype=object), real=np.ones(8))
    (folder / "empty.npz").write_bytes(b"")
    np.savez(folder / "none.npz")
    np.savez(folder / "nosamples.npz", x=np.zeros((0, 16), np.float32))
    np.save(folder / "single.npy", x)
    (folder / "forged.npz").write_bytes(_forged())
    (folder / "text.npz").write_text("x,y\n1,2\n")
    return folder


def _forged() -> bytes:
    """A 400-byte .npz whose one array declares shape (4_000_000_000, 16) float32 (238 GiB)."""
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": "<f4", "fortran_order": False,
                                                  "shape": (4_000_000_000, 16)})
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("x.npy", header.getvalue() + bytes(64))
    return buffer.getvalue()


def _sha(folder):
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


CASES = [
    ("empty.npz", "Data file '{f}' is empty; save the arrays with numpy.savez(path, name=array)."),
    ("none.npz", "Data file '{f}' holds no arrays; save one array per model input."),
    ("single.npy", "Data file '{f}' is a single .npy array, not an .npz; save it with "
                   "numpy.savez(path, input_name=array), one array per model input."),
    ("forged.npz", "'{f}': array 'x' declares shape (4000000000, 16) of float32 (256000000000 bytes), more "
                   "than the file holds; the file is truncated or corrupt."),
    ("nosamples.npz", "'{f}' holds no samples (axis 0 of 'x' has length 0); save at least one sample per "
                      "input."),
    ("text.npz", "Cannot read '{f}' as .npz without pickle: File is not a zip file"),
]


@pytest.mark.parametrize(("name", "message"), CASES, ids=[c[0] for c in CASES])
def test_a_malformed_data_file_is_one_error_and_nothing_is_written(folder, capsys, tmp_path, name, message):
    before = _sha(folder)
    out = tmp_path / "q.onnx"
    assert main(["calibrate", str(folder / "m.onnx"), "--data", str(folder / name), "--out", str(out),
                 "--no-progress"]) == 2
    assert capsys.readouterr().err == f"quantdbg calibrate: error: {message.format(f=folder / name)}\n"
    assert _sha(folder) == before and not out.exists()


def test_an_empty_eval_file_is_named_as_such(folder, capsys, tmp_path):
    assert main(["analyze", str(folder / "m.onnx"), "--data", str(folder / "calib.npz"), "--eval",
                 str(folder / "nosamples.npz"), "--out", str(tmp_path / "r.json")]) == 2
    assert capsys.readouterr().err == (f"quantdbg analyze: error: {str(folder / 'nosamples.npz')!r} holds no "
                                       "samples (axis 0 of 'x' has length 0); save at least one sample per "
                                       "input.\n")


@pytest.mark.parametrize(("key", "message"), [
    ("label", "--labels 'label': '{f}': array 'label' holds Python objects (dtype object), which are never "
              "unpickled; save numeric arrays."),
    ("real", "Accuracy labels must be integers, got dtype float64."),
    ("nope", "--labels 'nope': '{f}' has no array named 'nope' (it holds ['label', 'real', 'x']); save one "
             "array per model input under its name."),
])
def test_labels_that_are_objects_floats_or_missing_are_refused(folder, capsys, tmp_path, key, message):
    before = _sha(folder)
    assert main(["analyze", str(folder / "m.onnx"), "--data", str(folder / "calib.npz"), "--eval",
                 str(folder / "labels.npz"), "--labels", key, "--out", str(tmp_path / "r.json")]) == 2
    assert capsys.readouterr().err == \
        f"quantdbg analyze: error: {message.format(f=folder / 'labels.npz')}\n"
    assert _sha(folder) == before and not (tmp_path / "r.json").exists()


def test_a_genuine_array_at_deflates_highest_ratio_is_still_read(tmp_path):
    buffer = io.BytesIO()
    np.savez_compressed(buffer, x=np.zeros((4096, 64), np.float32))
    path = tmp_path / "z.npz"
    path.write_bytes(buffer.getvalue())
    with zipfile.ZipFile(io.BytesIO(buffer.getvalue())) as archive:
        info = archive.infolist()[0]
    assert info.file_size > 900 * info.compress_size  # all zeros: near deflate's limit of ~1032:1
    assert load_npz(path).arrays["x"].shape == (4096, 64)


def test_read_npz_reads_what_savez_wrote(tmp_path, rng):
    arrays = {"a": rng.standard_normal((3, 2)).astype(np.float32), "b": np.arange(5, dtype=np.int64)}
    np.savez(tmp_path / "d.npz", **arrays)
    read = read_npz(tmp_path / "d.npz")
    assert list(read) == ["a", "b"] and all(np.array_equal(read[k], arrays[k]) for k in arrays)
    with pytest.raises(DataError, match=r"does not exist\.$"):
        read_npz(tmp_path / "absent.npz")


def test_all_zero_activations_are_named_with_what_the_engine_does(tmp_path):
    with pytest.warns(QuantDbgWarning) as caught:
        quantize(ms.mlp4(), {"x": np.zeros((8, 16), np.float32)}, CalibConfig("minmax"))
    messages = sorted(str(w.message) for w in caught if issubclass(w.category, QuantDbgWarning))
    assert messages[0] == ("Tensor 'act0' had only zeros during calibration; it gets the range +-1 (scale "
                           "1/127): zeros stay exact in INT8, and the engine clips any value beyond +-1 at "
                           "run time. Check that the calibration data exercises it.")
    assert [m.split("'")[1] for m in messages] == ["act0", "act1", "act2", "x"]


# ---------------------------------------------------------------------------------------------
# NaN / Inf in the data: one line naming the input, the sample (from 0 over all batches), the count
# ---------------------------------------------------------------------------------------------

def _nonfinite_message(origin: str, count: int, sample: str) -> str:
    return (f"{origin}: input 'x' holds {count} NaN/Inf value(s), the first in {sample}; NaN and Inf cannot "
            "be calibrated or evaluated. Remove or repair that sample, or check the preprocessing.")


@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf], ids=["nan", "inf", "-inf"])
def test_nonfinite_calibration_data_is_refused_naming_the_sample(folder, capsys, tmp_path, value):
    x = np.random.default_rng(1).standard_normal((40, 16)).astype(np.float32)
    x[17, 3] = x[17, 9] = x[30, 0] = value
    path = tmp_path / "bad.npz"
    np.savez(path, x=x)
    before = _sha(tmp_path)
    assert main(["calibrate", str(folder / "m.onnx"), "--data", str(path), "--batch-size", "4", "--out",
                 str(tmp_path / "q.onnx"), "--no-progress"]) == 2
    assert capsys.readouterr().err == \
        f"quantdbg calibrate: error: {_nonfinite_message(repr(str(path)), 3, 'sample 17 (counted from 0)')}\n"
    assert _sha(tmp_path) == before


def test_nonfinite_evaluation_data_is_refused_naming_the_file(folder, capsys, tmp_path):
    x = np.random.default_rng(2).standard_normal((12, 16)).astype(np.float32)
    x[5, 0] = np.nan
    path = tmp_path / "eval.npz"
    np.savez(path, x=x)
    assert main(["analyze", str(folder / "m.onnx"), "--data", str(folder / "calib.npz"), "--eval", str(path),
                 "--no-evidence", "--out", str(tmp_path / "r.json")]) == 2
    assert capsys.readouterr().err == \
        f"quantdbg analyze: error: {_nonfinite_message(repr(str(path)), 1, 'sample 5 (counted from 0)')}\n"
    assert not (tmp_path / "r.json").exists()


class _Batches:
    """Re-iterable feeds that are neither arrays nor a list: checked feed by feed as they come."""

    def __init__(self, feeds):
        self.feeds = feeds

    def __iter__(self):
        return iter(self.feeds)


@pytest.mark.parametrize("wrap", [list, _Batches], ids=["feed list", "iterable"])
def test_the_api_counts_samples_over_every_batch(wrap):
    rng = np.random.default_rng(3)
    feeds = [{"x": rng.standard_normal((n, 16)).astype(np.float32)} for n in (4, 3, 5)]
    feeds[2]["x"][3, 1] = np.inf  # sample 4 + 3 + 3 = 10
    where = "The data" if wrap is list else "calibration batch 2"
    with pytest.raises(DataError) as caught:
        quantize(ms.mlp4(), wrap(feeds), CalibConfig("minmax"))
    assert str(caught.value) == _nonfinite_message(where, 1, "sample 10 (counted from 0)")


def test_a_runner_refuses_a_nonfinite_feed():
    from quantdbg.backends.onnxrt import OnnxrtRunner

    x = np.ones((3, 16), np.float32)
    x[1:, 0] = np.nan
    with OnnxrtRunner(ms.mlp4()) as runner, pytest.raises(DataError) as caught:
        runner.infer({"x": x})
    assert str(caught.value) == _nonfinite_message("feed", 2, "sample 1 of this feed")


# ---------------------------------------------------------------------------------------------
# Labels: class indices from 0 to the number of classes - 1
# ---------------------------------------------------------------------------------------------

def _labels_file(tmp_path, position: int, value: int):
    rng = np.random.default_rng(4)
    labels = rng.integers(0, 16, 12)
    labels[position] = value
    path = tmp_path / "eval.npz"
    np.savez(path, x=rng.standard_normal((12, 16)).astype(np.float32), label=labels)
    return path


def _label_message(path, where: str, value: int, valid: str) -> str:
    return (f"Accuracy labels (--labels 'label' of {str(path)!r}): {where} has label {value}, but labels "
            f"are class indices {valid}; 1 label(s) are out of range. Fix the labels, or pick the array that "
            "holds them.")


def test_a_negative_label_is_refused_naming_the_file_the_sample_and_the_value(folder, capsys, tmp_path):
    path = _labels_file(tmp_path, 7, -3)
    before = _sha(tmp_path)
    assert main(["analyze", str(folder / "m.onnx"), "--data", str(folder / "calib.npz"), "--eval", str(path),
                 "--labels", "label", "--no-evidence", "--out", str(tmp_path / "r.json")]) == 2
    assert capsys.readouterr().err == \
        f"quantdbg analyze: error: {_label_message(path, 'sample 7', -3, 'from 0')}\n"
    assert _sha(tmp_path) == before


def test_a_label_past_the_last_class_is_refused(folder, capsys, tmp_path):
    path = _labels_file(tmp_path, 9, 16)  # mlp4 has 16 outputs: classes 0..15
    assert main(["analyze", str(folder / "m.onnx"), "--data", str(folder / "calib.npz"), "--eval", str(path),
                 "--labels", "label", "--no-evidence", "--out", str(tmp_path / "r.json")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and not (tmp_path / "r.json").exists()
    assert _label_message(path, "sample 9", 16, "0 to 15 (output 'y' has 16)") in err


def test_accuracy_checks_labels_against_the_class_axis():
    from quantdbg.evaluation import Accuracy

    labels = np.zeros((2, 3), np.int64)
    labels[1, 2] = 4
    logits = {"y": np.zeros((2, 3, 4), np.float32)}
    with pytest.raises(DataError) as caught:
        Accuracy(labels).from_outputs(logits, logits)
    assert str(caught.value) == ("Accuracy labels: position (1, 2) has label 4, but labels are class "
                                 "indices 0 to 3 (output 'y' has 4); 1 label(s) are out of range. Fix the "
                                 "labels, or pick the array that holds them.")
    labels[1, 2] = 3
    assert Accuracy(labels).from_outputs(logits, logits) == pytest.approx(5 / 6)  # argmax 0 everywhere


@pytest.mark.parametrize("method", ["minmax", "percentile", "entropy", "mse"])
def test_the_cli_refuses_a_sample_beyond_fp16_with_every_method(folder, capsys, tmp_path, method):
    x = np.random.default_rng(5).standard_normal((40, 16)).astype(np.float32)
    x[21, 2] = 3e38
    np.savez(tmp_path / "big.npz", x=x)
    before = _sha(tmp_path)
    assert main(["calibrate", str(folder / "m.onnx"), "--data", str(tmp_path / "big.npz"), "--method", method,
                 "--out", str(tmp_path / "q.onnx"), "--cache", str(tmp_path / "q.cache"),
                 "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("quantdbg calibrate: error: Tensor 'x' reaches 3e+38 during calibration, in "
                          "sample 21 alone (counted from 0), beyond float16's range (+-65504) and more than "
                          "254 times its 639 other values (at most ")
    assert "Remove or clip sample 21, or check the preprocessing." in err and err.count("\n") == 1
    assert _sha(tmp_path) == before


def test_a_refused_sample_beyond_fp16_is_the_only_message(folder, capsys, tmp_path):
    """The 3e38 overflows to Inf in the layers after the input; those NaN/Inf counts follow from the
    refused value, so the refusal is all the user reads: no warning before it."""
    x = np.random.default_rng(5).standard_normal((40, 16)).astype(np.float32)
    x[21, 2] = 3e38
    np.savez(tmp_path / "big.npz", x=x)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert main(["calibrate", str(folder / "m.onnx"), "--data", str(tmp_path / "big.npz"),
                     "--out", str(tmp_path / "q.onnx"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert [str(w.message) for w in caught] == []
    assert err.count("\n") == 1 and err.startswith("quantdbg calibrate: error: Tensor 'x' reaches 3e+38 ")
