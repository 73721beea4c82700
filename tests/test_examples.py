"""The example scripts run and print FP32 vs naive INT8 vs quantdbg's automatic result.

The embedded-model example always runs; the zoo examples skip when ../shared/models has not been
built (``zoo_model`` fixture). ``train_digits.py`` is checked where a PyTorch environment exists:
deterministic on one machine, and giving the shipped model's graph and accuracy. Examples and the
notebook import only what quantdbg's packages export.
"""
from __future__ import annotations

import ast
import importlib
import json
import os
import re
import subprocess
import sys
from importlib import resources
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
NOTEBOOK = EXAMPLES.parent / "notebooks" / "walkthrough.ipynb"
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


def _quantdbg_imports(source: str) -> list[tuple[str, str]]:
    """(module, name) of every ``from quantdbg... import name`` and ``import quantdbg...`` in ``source``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "quantdbg":
            found += [(node.module, alias.name) for alias in node.names]
        elif isinstance(node, ast.Import):
            found += [(alias.name, "") for alias in node.names if alias.name.split(".")[0] == "quantdbg"]
    return found


def _notebook_code() -> str:
    cells = json.loads(NOTEBOOK.read_text())["cells"]
    return "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")


@pytest.mark.parametrize("source", [*sorted(p.name for p in EXAMPLES.glob("*.py")), NOTEBOOK.name])
def test_examples_and_notebook_use_only_the_public_api(source):
    """``quantdbg`` itself, or a name a package (or a top-level module) exports; never an inner module."""
    code = _notebook_code() if source == NOTEBOOK.name else (EXAMPLES / source).read_text()
    imports = _quantdbg_imports(code)
    assert imports or source.startswith("_"), "no quantdbg import found"
    for module, name in imports:
        assert module.count(".") <= 1, f"{source} imports the inner module {module}"
        exported = getattr(importlib.import_module(module), "__all__", None)
        if name and exported is not None:
            assert name in exported, f"{source}: {module} does not export {name}"
        assert not name.startswith("_"), f"{source} imports the private {module}.{name}"


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
    for script, name in (("minilm_l6.py", "minilm_l6_v2_text"), ("silero_vad.py", "silero_vad_16k")):
        assert _run(script, env=env) == (
            f"skipped: zoo model {name!r} is not available: $QDBG_MODELS ({tmp_path}) has no "
            f"{name}/model.onnx. Build the model zoo and set QDBG_MODELS to its folder (README.md, "
            "'Benchmarks and the model zoo'); examples/digits_cnn.py runs on the model shipped inside "
            "quantdbg without it.\n")


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


def _graph_structure(path: Path) -> tuple:
    """Everything of an ONNX model but its weight values: nodes (names, ops, wiring, attributes),
    initializer names/types/shapes, graph inputs and outputs, opsets and IR version."""
    import onnx

    def attribute(a):
        if a.type == onnx.AttributeProto.TENSOR:  # a constant: its type and shape, not its values
            return a.name, a.t.data_type, tuple(a.t.dims)
        return a.name, onnx.helper.get_attribute_value(a)

    model = onnx.load(str(path))
    graph = model.graph
    return (tuple((n.name, n.op_type, tuple(n.input), tuple(n.output), tuple(map(attribute, n.attribute)))
                  for n in graph.node),
            tuple((i.name, i.data_type, tuple(i.dims)) for i in graph.initializer),
            tuple(str(v) for v in (*graph.input, *graph.output)),
            tuple((o.domain, o.version) for o in model.opset_import), model.ir_version)


def _top1(model: Path) -> float:
    """Top-1 of a digits model on the embedded held-out digits, through ONNX Runtime."""
    import onnxruntime as ort

    from quantdbg.demo import INPUT_NAME, load_embedded

    emb = load_embedded()
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    logits = session.run(None, {INPUT_NAME: emb.eval_inputs[INPUT_NAME]})[0]
    return float((logits.argmax(axis=1) == emb.labels).mean())


@pytest.mark.slow
@pytest.mark.skipif(not TORCH_PYTHON.is_file(), reason="no PyTorch environment to retrain the embedded model")
def test_train_digits_is_deterministic_and_reproduces_the_embedded_model(tmp_path):
    """Retraining cannot reproduce the shipped weights bit for bit on another CPU (its float kernels
    round differently), so: two runs here give identical files; the data file, which no float
    kernel touches, is the shipped one; the model has the shipped model's graph and its accuracy."""
    check = subprocess.run([str(TORCH_PYTHON), "-c", "import torch, sklearn, onnxscript"],
                           capture_output=True)
    if check.returncode != 0:
        pytest.skip("the PyTorch environment lacks torch, scikit-learn or onnxscript")
    runs = [tmp_path / "first", tmp_path / "second"]
    for out in runs:
        done = subprocess.run([str(TORCH_PYTHON), str(EXAMPLES / "train_digits.py"), "--out", str(out)],
                              capture_output=True, text=True, timeout=1800)
        assert done.returncode == 0, done.stderr[-3000:]
    for name in ("digits_cnn.onnx", "digits.npz"):
        assert (runs[0] / name).read_bytes() == (runs[1] / name).read_bytes(), f"{name} differs between runs"
    shipped = Path(str(resources.files("quantdbg").joinpath("_data")))
    assert (runs[0] / "digits.npz").read_bytes() == (shipped / "digits.npz").read_bytes()
    assert _graph_structure(runs[0] / "digits_cnn.onnx") == _graph_structure(shipped / "digits_cnn.onnx")
    shipped_top1, retrained_top1 = _top1(shipped / "digits_cnn.onnx"), _top1(runs[0] / "digits_cnn.onnx")
    assert shipped_top1 >= 0.99  # README: 99.26 % on the 540 held-out digits
    assert retrained_top1 >= shipped_top1 - 0.01, (retrained_top1, shipped_top1)
