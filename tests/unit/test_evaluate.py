"""Task metrics: ready-made ones against NumPy, user callables, and evaluation commands."""
from __future__ import annotations

import shlex
import sys

import models
import numpy as np
import pytest

from quantdbg.errors import BackendError, ConfigError, DataError
from quantdbg.evaluation import (
    Accuracy,
    CommandMetric,
    ModelFunction,
    OutputFunction,
    OutputMetric,
    Top1Agreement,
)
from quantdbg.evaluation.task import as_task_metric, concat_batches, parse_metric_line

PY = shlex.quote(sys.executable)


def test_top1_agreement_and_accuracy_match_numpy(rng):
    ref = rng.standard_normal((50, 4))
    out = ref + rng.standard_normal((50, 4))
    labels = rng.integers(0, 4, 50)
    assert Top1Agreement().from_outputs({"y": out}, {"y": ref}) == pytest.approx(
        np.mean(out.argmax(1) == ref.argmax(1)))
    want = np.mean(out.argmax(1) == labels)
    assert Accuracy(labels).from_outputs({"y": out}, {"y": ref}) == pytest.approx(want)


def test_accuracy_checks_the_label_count(rng):
    metric = Accuracy(np.zeros(3, np.int64))
    with pytest.raises(DataError, match=r"^Accuracy: output 'y' gives predictions of shape \(5,\) but the "
                                        r"labels have shape \(3,\); give one label per sample, in order\.$"):
        metric.from_outputs({"y": np.zeros((5, 2))}, {"y": np.zeros((5, 2))})
    with pytest.raises(DataError, match="must be integers"):
        Accuracy(np.zeros(3))


def test_a_metric_on_the_first_samples_scores_their_labels(rng):
    ref = rng.standard_normal((50, 4))
    out = ref + rng.standard_normal((50, 4))
    labels = rng.integers(0, 4, 50)
    head = Accuracy(labels, origin="labels.npy").on_first(20)
    assert head.identity() == Accuracy(labels[:20]).identity() and head.origin == "labels.npy"
    assert head.from_outputs({"y": out[:20]}, {"y": ref[:20]}) == pytest.approx(
        np.mean(out[:20].argmax(1) == labels[:20]))
    whole = Accuracy(labels)
    assert whole.on_first(50) is whole and whole.on_first(80) is whole
    for metric in (OutputMetric("sqnr"), Top1Agreement(), OutputFunction(lambda o, r: 1.0)):
        assert metric.on_first(20) is metric  # outputs against the reference: any samples as they come


def test_ready_metrics_need_an_output_name_when_there_are_several():
    with pytest.raises(ConfigError, match=r"the model has 2 outputs \(\['a', 'b'\]\); name the one"):
        Top1Agreement().from_outputs({"a": np.zeros((1, 2)), "b": np.zeros((1, 2))},
                                     {"a": np.zeros((1, 2)), "b": np.zeros((1, 2))})


def test_output_metric_directions():
    assert as_task_metric("sqnr").higher_is_better
    assert not as_task_metric("rel_l2").higher_is_better
    ref = {"y": np.array([[3.0, 4.0]])}
    assert OutputMetric("rel_l2").from_outputs({"y": np.array([[3.0, 4.5]])}, ref) == pytest.approx(0.1)


def test_output_function_rejects_non_numbers():
    metric = OutputFunction(lambda out, ref: "bad", name="mine")
    with pytest.raises(DataError, match=r"^task metric 'mine' returned 'bad', not a number\.$"):
        metric.from_outputs({}, {})


def test_model_function_gets_a_model_file(tmp_path):
    seen = []
    metric = ModelFunction(lambda path: seen.append(path.suffix) or 0.5)
    assert metric.evaluate_model(models.mlp()) == 0.5
    assert seen == [".onnx"]


def test_command_metric_reads_the_last_line():
    script = "import sys; print('log line'); print(len(sys.argv[1]) * 0 + 0.75)"
    metric = CommandMetric(f"{PY} -c \"{script}\" {{model}}")
    assert metric.evaluate_model(models.mlp()) == 0.75


def test_command_metric_errors():
    with pytest.raises(ConfigError, match=r"does not contain \{model\}; put \{model\} where the model path"):
        CommandMetric("python eval.py")
    with pytest.raises(ConfigError, match=r"^The evaluation command is empty"):
        CommandMetric("   ")
    failing = CommandMetric(f"{PY} -c \"import sys; sys.exit('broken eval')\" {{model}}")
    with pytest.raises(BackendError, match=r"exited with status 1: broken eval$"):
        failing.evaluate_model(models.mlp())
    missing = CommandMetric("quantdbg-no-such-program {model}")
    with pytest.raises(BackendError, match=r"program 'quantdbg-no-such-program' not found\.$"):
        missing.evaluate_model(models.mlp())


def test_parse_metric_line_messages():
    assert parse_metric_line("a\n 0.5 \n\n", "cmd") == 0.5
    with pytest.raises(BackendError, match=r"^Evaluation command 'cmd' printed nothing; it must print the "
                                           r"task metric as its last line\.$"):
        parse_metric_line("\n", "cmd")
    with pytest.raises(BackendError, match=r"last printed line 'acc=0.5' is not a number; print the task "
                                           r"metric alone on the last line\.$"):
        parse_metric_line("acc=0.5", "cmd")
    with pytest.raises(BackendError, match=r"printed 'nan'; the task metric must be finite\.$"):
        parse_metric_line("nan", "cmd")


def test_concat_batches():
    joined = concat_batches([{"y": np.ones((2, 3)), "s": np.float32(1)},
                             {"y": np.zeros((1, 3)), "s": np.float32(2)}])
    assert joined["y"].shape == (3, 3) and joined["s"].tolist() == [1.0, 2.0]


def test_command_metric_names_the_existing_files_of_its_command(tmp_path):
    (tmp_path / "score.py").write_text("print(1)\n")
    (tmp_path / "eval.npz").write_bytes(b"x")
    metric = CommandMetric("python score.py {model} --data=eval.npz --cache=missing.npz {model}.txt",
                           cwd=tmp_path)
    # The interpreter is looked up on PATH, the missing file and the model's own path are not inputs.
    assert metric.files() == ((tmp_path / "score.py").resolve(), (tmp_path / "eval.npz").resolve())
