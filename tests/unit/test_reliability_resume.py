"""A resume file is used only by the run that wrote it: everything that changes a score is in its
fingerprint, and a mismatch names what differs."""
from __future__ import annotations

import hashlib
import shlex
import sys

import models_sensitivity as ms
import numpy as np
import pytest

from quantdbg.cli import main
from quantdbg.errors import ConfigError
from quantdbg.evaluation import Accuracy, CommandMetric, OutputFunction, OutputMetric
from quantdbg.qdq import records_from_model
from quantdbg.sensitivity import SensitivityConfig, analyze_sensitivity

PY = shlex.quote(sys.executable)
# Prints 1 for argument A and 2 for B, without importing anything heavy.
SCORE = f"{PY} -c \"import sys; print(1.0 if sys.argv[2] == 'A' else 2.0)\" {{model}}"


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("resume")
    x = ms.write_mlp4_pair(folder)
    np.savez(folder / "eval.npz", x=x, label=np.argmax(x, axis=1), other=np.argmin(x, axis=1))
    return folder


def _sha(folder):
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def test_a_command_with_other_arguments_does_not_resume_another_commands_sweep(folder, capsys, tmp_path):
    partial = tmp_path / "r.json.partial"
    data = np.load(folder / "eval.npz")
    analyze_sensitivity(str(folder / "m.onnx"), _qdq(folder), [{"x": data["x"]}],
                        SensitivityConfig(mode="isolated", evidence=False, results_path=partial),
                        metric=CommandMetric(SCORE.replace("{model}", "{model} A")))
    left, inputs = partial.read_bytes(), _sha(folder)
    capsys.readouterr()
    code = main(["analyze", str(folder / "q.onnx"), "--fp32", str(folder / "m.onnx"), "--eval",
                 str(folder / "eval.npz"), "--mode", "isolated", "--no-evidence",
                 "--evaluate", SCORE.replace("{model}", "{model} B"), "--out", str(tmp_path / "r.json")])
    assert code == 2
    assert capsys.readouterr().err == (
        f"quantdbg analyze: error: Resume file {str(partial)!r} belongs to another run: the metric "
        "changed; pass --restart to start over (or delete the file).\n")
    assert partial.read_bytes() == left and _sha(folder) == inputs
    assert not (tmp_path / "r.json").exists()


def _qdq(folder):
    return records_from_model(str(folder / "q.onnx"))


def test_accuracy_with_other_labels_does_not_resume(folder, tmp_path):
    data = np.load(folder / "eval.npz")
    feeds, path = [{"x": data["x"]}], tmp_path / "r.json"
    config = SensitivityConfig(mode="isolated", evidence=False, results_path=path)
    first = analyze_sensitivity(str(folder / "m.onnx"), _qdq(folder), feeds, config,
                                metric=Accuracy(data["label"]))
    again = analyze_sensitivity(str(folder / "m.onnx"), _qdq(folder), feeds, config,
                                metric=Accuracy(data["label"].copy()))  # same labels: resumed
    assert again == first
    with pytest.raises(ConfigError, match=r"belongs to another run: the metric changed; pass --restart to "
                                          r"start over"):
        analyze_sensitivity(str(folder / "m.onnx"), _qdq(folder), feeds, config,
                            metric=Accuracy(data["other"]))
    with pytest.raises(ConfigError, match=r"belongs to another run: the data changed;"):
        analyze_sensitivity(str(folder / "m.onnx"), _qdq(folder), [{"x": data["x"][::-1].copy()}], config,
                            metric=Accuracy(data["label"]))


def _one(outputs, reference):
    return 1.0


def _two(outputs, reference):
    return 2.0


@pytest.mark.parametrize(("a", "b"), [
    (CommandMetric("python s.py {model} A"), CommandMetric("python s.py {model} B")),
    (CommandMetric("python s.py {model}", cwd="/a"), CommandMetric("python s.py {model}", cwd="/b")),
    (CommandMetric("python s.py {model}"), CommandMetric("python s.py {model}", higher_is_better=False)),
    (Accuracy(np.array([0, 1])), Accuracy(np.array([1, 0]))),
    (Accuracy(np.array([0, 1])), Accuracy(np.array([0, 1]), axis=0)),
    (Accuracy(np.array([0, 1], np.int32)), Accuracy(np.array([0, 1], np.int64))),
    (OutputMetric("sqnr"), OutputMetric("sqnr", output="y")),
    (OutputFunction(_one), OutputFunction(_two)),
])
def test_metrics_that_score_differently_have_different_identities(a, b):
    assert a.identity() != b.identity()


def test_identity_ignores_what_does_not_change_a_score():
    assert CommandMetric("python s.py {model}", timeout=5).identity() == \
        CommandMetric("python  s.py '{model}'", timeout=9).identity()
    assert Accuracy(np.arange(3)).identity() == Accuracy(np.arange(3)).identity()
