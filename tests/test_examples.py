"""The example scripts run and print FP32 vs naive INT8 vs quantdbg's automatic result.

The embedded-model example always runs; the zoo examples skip when ../shared/models has not been
built (``zoo_model`` fixture). ``train_digits.py`` is checked for reproducibility where a PyTorch
environment exists.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from importlib import resources
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
TORCH_PYTHON = Path(os.environ.get("QDBG_VENV", "/tmp/qdbg_venv")) / "bin" / "python"


def _run(script: str, *args: str, env: dict | None = None, timeout: int = 1800) -> str:
    done = subprocess.run([sys.executable, str(EXAMPLES / script), *args], capture_output=True, text=True,
                          timeout=timeout, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def _rows(text: str, *names: str) -> dict[str, list[str]]:
    """The table row of each variant: its cells after the name."""
    found = {}
    for name in names:
        match = re.search(rf"^{re.escape(name)}\s{{2,}}(.*)$", text, re.M)
        assert match, f"no row {name!r} in:\n{text}"
        found[name] = match.group(1).split()
    return found


VARIANTS_DIGITS = ("FP32", "naive INT8 (minmax)", "quantdbg (entropy + fallback)")


def test_digits_example_on_the_embedded_model():
    text = _run("digits_cnn.py", "--threads", "1")
    rows = _rows(text, *VARIANTS_DIGITS)
    fp32, naive, auto = (float(rows[v][1]) for v in VARIANTS_DIGITS)
    assert rows["FP32"][0] == "0/8" and rows["naive INT8 (minmax)"][0] == "8/8"
    assert fp32 >= 0.97
    assert abs(naive - fp32) <= 0.005
    assert auto >= fp32  # the fallback target: no top-1 loss against FP32
    assert re.search(r"^fallback: \d+ of 8 node\(s\) out of INT8 meet", text, re.M)


def test_zoo_examples_skip_cleanly_without_the_zoo(tmp_path):
    env = {**os.environ, "QDBG_MODELS": str(tmp_path)}
    for script in ("minilm_l6.py", "silero_vad.py"):
        assert _run(script, env=env).startswith("skipped: zoo model")


@pytest.mark.zoo
@pytest.mark.slow
def test_digits_example_on_the_zoo_model(zoo_model):
    zoo_model("digits_cnn")
    rows = _rows(_run("digits_cnn.py", "--zoo", "--threads", "2"), *VARIANTS_DIGITS)
    for variant in VARIANTS_DIGITS:  # in-process top-1 agrees with the builder's own scoring
        assert rows[variant][1] == rows[variant][2]
    assert float(rows[VARIANTS_DIGITS[2]][2]) >= float(rows["FP32"][2])


@pytest.mark.zoo
@pytest.mark.slow
def test_minilm_example_meets_the_issue_target(zoo_model):
    zoo_model("minilm_l6_v2_text")
    text = _run("minilm_l6.py", "--threads", "2")
    rows = _rows(text, "FP32", "naive INT8 (minmax)", "quantdbg (fallback)")
    recall, cosine = float(rows["quantdbg (fallback)"][1]), float(rows["quantdbg (fallback)"][3])
    assert recall >= 0.330 and cosine >= 0.99
    assert float(rows["naive INT8 (minmax)"][3]) < 0.99  # naive INT8 misses it
    int8, total = map(int, rows["quantdbg (fallback)"][0].split("/"))
    assert total - int8 <= 8  # at most 8 MatMuls left in FP16


@pytest.mark.zoo
@pytest.mark.slow
def test_silero_example_keeps_the_auc(zoo_model):
    zoo_model("silero_vad_16k")
    text = _run("silero_vad.py", "--threads", "2")
    rows = _rows(text, "FP32", "naive INT8 (minmax)", "quantdbg (entropy + fallback)")
    fp32, auto = float(rows["FP32"][1]), float(rows["quantdbg (entropy + fallback)"][1])
    assert auto >= fp32 * (1 - 0.001) - 1e-4  # within 0.1 % (4-decimal printing)


@pytest.mark.slow
@pytest.mark.skipif(not TORCH_PYTHON.is_file(), reason="no PyTorch environment to retrain the embedded model")
def test_train_digits_reproduces_the_embedded_files(tmp_path):
    check = subprocess.run([str(TORCH_PYTHON), "-c", "import torch, sklearn, onnxscript"],
                           capture_output=True)
    if check.returncode != 0:
        pytest.skip("the PyTorch environment lacks torch, scikit-learn or onnxscript")
    done = subprocess.run([str(TORCH_PYTHON), str(EXAMPLES / "train_digits.py"), "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, done.stderr[-3000:]
    shipped = Path(str(resources.files("quantdbg").joinpath("_data")))
    for name in ("digits_cnn.onnx", "digits.npz"):
        assert (tmp_path / name).read_bytes() == (shipped / name).read_bytes(), name
