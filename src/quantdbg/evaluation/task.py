"""Task metrics: the number that says whether a quantized model is still good enough.

Two kinds exist, and the analysis treats them differently because of cost:

* output metrics (:class:`OutputMetric`, :class:`Top1Agreement`, :class:`Accuracy`,
  :class:`OutputFunction`) are computed from the model's outputs on the evaluation data, so every
  variant of a sweep is just another feed to one ONNX Runtime session;
* model metrics (:class:`ModelFunction`, :class:`CommandMetric`) need the variant as a model file,
  e.g. ``quantdbg fallback ... --evaluate 'python eval.py {model}'``; each evaluation writes a
  model to a temporary folder and runs the user's code on it.
"""
from __future__ import annotations

import functools
import math
import os
import shlex
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from quantdbg._fingerprint import array_digest, digest, file_digest
from quantdbg.errors import BackendError, ConfigError, DataError
from quantdbg.evaluation.metrics import HIGHER_IS_BETTER, MetricName, check_metric_name
from quantdbg.execution.command import run_in_own_group
from quantdbg.model import save_model

Outputs = Mapping[str, np.ndarray]
"""Output name -> every evaluation sample's output, concatenated on axis 0."""

MODEL_PLACEHOLDER = "{model}"


class TaskMetric:
    """A scalar quality measure of a model variant.

    Attributes:
        name: Short label used in reports.
        higher_is_better: Direction of the metric.
        needs_model: True when the metric runs on a model file (:meth:`from_model`), False when it
            is computed from outputs (:meth:`from_outputs`).
    """

    name: str = "metric"
    higher_is_better: bool = True
    needs_model: bool = False
    identity_attrs: tuple[str, ...] = ()
    """The attributes that change this metric's scores (beyond its class and description)."""

    def from_outputs(self, outputs: Outputs, reference: Outputs) -> float:
        """Scores a variant from its outputs.

        Args:
            outputs: The variant's outputs over the evaluation data (samples on axis 0).
            reference: The FP32 model's outputs on the same data.

        Returns:
            The metric.
        """
        raise NotImplementedError(f"{type(self).__name__} is computed from a model file, not outputs.")

    def from_model(self, path: Path) -> float:
        """Scores a variant saved at ``path``.

        Args:
            path: The variant's ``.onnx`` file.

        Returns:
            The metric.
        """
        raise NotImplementedError(f"{type(self).__name__} is computed from outputs, not a model file.")

    def evaluate_model(self, model: onnx.ModelProto) -> float:
        """Writes ``model`` to a temporary folder and scores it with :meth:`from_model`."""
        _remove_stale_folders()
        with tempfile.TemporaryDirectory(prefix=f"{_EVAL_PREFIX}{os.getpid()}-") as tmp:
            path = save_model(model, Path(tmp) / "model.onnx")
            return self.from_model(path)

    def on_first(self, n_samples: int) -> TaskMetric:
        """This metric scoring only the first ``n_samples`` samples of the evaluation data, in order
        (the output-space ranking scores a leading part of it).

        A metric of the outputs against the reference alone scores any samples as they come (this
        one is returned); a metric holding data per sample (e.g. :class:`Accuracy`'s labels)
        returns a copy holding the first ``n_samples`` of them.
        """
        return self

    def describe(self) -> str:
        """One line naming the metric and its direction."""
        return f"{self.name} ({'higher' if self.higher_is_better else 'lower'} is better)"

    def identity(self) -> str:
        """Everything that changes this metric's scores, as text (resume fingerprints compare it).

        The class, the description and the attributes named in ``identity_attrs``: arrays by a
        digest of their bytes, functions by their qualified name, nested metrics by their own
        identity. A subclass with parameters of its own lists them there (or overrides this).
        """
        parts = [f"{type(self).__module__}.{type(self).__qualname__}", self.describe()]
        parts += [f"{key}={_identity_of(getattr(self, key, None))}" for key in self.identity_attrs]
        return "|".join(parts)

    def ingredients(self) -> dict[str, str]:
        """What decides this metric's scores, as named digests a resume journal compares one by one:
        its :meth:`identity` (and, for a command, the contents of every file it reads)."""
        return {"metric": digest(self.identity())}


_EVAL_PREFIX = "quantdbg-eval-"


@functools.cache
def _remove_stale_folders() -> None:
    """Removes the evaluation folders of runs that were killed outright (SIGKILL gives no chance to
    clean up); a folder's name carries its process id, and only folders of dead processes go."""
    for folder in Path(tempfile.gettempdir()).glob(f"{_EVAL_PREFIX}*-*"):
        pid = folder.name[len(_EVAL_PREFIX):].split("-", 1)[0]
        if pid.isdigit() and int(pid) != os.getpid() and not _running(int(pid)):
            shutil.rmtree(folder, ignore_errors=True)


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    return True


def _identity_of(value: Any) -> str:
    if isinstance(value, TaskMetric):
        return value.identity()
    if isinstance(value, np.ndarray):
        return f"array({array_digest(value)})"
    if callable(value):
        return f"{getattr(value, '__module__', '?')}.{getattr(value, '__qualname__', type(value).__name__)}"
    if type(value).__repr__ is object.__repr__:  # the default repr holds a memory address
        return type(value).__qualname__
    return repr(value)


def _select(outputs: Outputs, output: str | None, what: str) -> str:
    if output is None:
        if len(outputs) != 1:
            raise ConfigError(f"{what}: the model has {len(outputs)} outputs ({sorted(outputs)}); "
                              "name the one to score with output=...")
        return next(iter(outputs))
    if output not in outputs:
        raise DataError(f"{what}: no output named {output!r} (outputs: {sorted(outputs)}).")
    return output


class OutputMetric(TaskMetric):
    """An output-difference metric against FP32 (SQNR, cosine, ...), as a task metric.

    Args:
        metric: Which metric (see :data:`quantdbg.evaluation.metrics.MetricName`).
        output: Score only this output (None: all outputs pooled).
    """

    identity_attrs = ("metric", "output")

    def __init__(self, metric: MetricName = "sqnr", output: str | None = None) -> None:
        self.metric = check_metric_name(metric)
        self.output = output
        self.name = metric if output is None else f"{metric}[{output}]"
        self.higher_is_better = HIGHER_IS_BETTER[metric]

    def from_outputs(self, outputs: Outputs, reference: Outputs) -> float:
        """Returns the metric of ``outputs`` against ``reference``."""
        from quantdbg.evaluation.metrics import MetricAccumulator

        acc = MetricAccumulator()
        names = list(reference) if self.output is None else [_select(reference, self.output, self.name)]
        acc.update({n: reference[n] for n in names}, outputs)
        return acc.result().total.value(self.metric)


def _argmax_rows(values: np.ndarray, axis: int) -> np.ndarray:
    return np.asarray(values).argmax(axis=axis)


class Top1Agreement(TaskMetric):
    """Share of positions whose argmax (class) equals the FP32 model's argmax.

    Args:
        output: The logits/probabilities output (None: the only output).
        axis: The class axis.
    """

    name = "top1_agreement"

    identity_attrs = ("output", "axis")

    def __init__(self, output: str | None = None, axis: int = -1) -> None:
        self.output = output
        self.axis = axis

    def from_outputs(self, outputs: Outputs, reference: Outputs) -> float:
        """Returns the agreement in [0, 1]."""
        name = _select(reference, self.output, self.name)
        got = _argmax_rows(outputs[name], self.axis)
        want = _argmax_rows(reference[name], self.axis)
        return float((got == want).mean()) if want.size else 1.0


class Accuracy(TaskMetric):
    """Share of samples whose argmax matches the label.

    Args:
        labels: One integer label per position of the argmax (e.g. shape ``(N,)`` for ``(N, C)``
            logits), in evaluation-data order: class indices from 0.
        output: The logits output (None: the only output).
        axis: The class axis.
        origin: Where the labels come from, for messages (e.g. ``"--labels 'label' of 'eval.npz'"``).

    Raises:
        DataError: ``labels`` is not an integer array, or holds a negative label.
    """

    name = "accuracy"

    identity_attrs = ("labels", "output", "axis")

    def __init__(self, labels: np.ndarray, output: str | None = None, axis: int = -1,
                 origin: str | None = None) -> None:
        self.labels = np.asarray(labels)
        if not np.issubdtype(self.labels.dtype, np.integer):
            raise DataError(f"Accuracy labels must be integers, got dtype {self.labels.dtype}.")
        self.output = output
        self.axis = axis
        self.origin = origin
        self._check_labels(None)

    def on_first(self, n_samples: int) -> Accuracy:
        """The accuracy of the first ``n_samples`` samples: their labels (this one when it holds no more)."""
        if n_samples >= len(self.labels):
            return self
        return Accuracy(self.labels[:n_samples], self.output, self.axis, self.origin)

    def from_outputs(self, outputs: Outputs, reference: Outputs) -> float:
        """Returns the accuracy in [0, 1].

        Raises:
            DataError: The number of predictions differs from the number of labels, or a label is
                no class of the output.
        """
        name = _select(reference, self.output, self.name)
        pred = _argmax_rows(outputs[name], self.axis)
        if pred.shape != self.labels.shape:
            raise DataError(f"Accuracy: output {name!r} gives predictions of shape {pred.shape} but the "
                            f"labels have shape {self.labels.shape}; give one label per sample, in order.")
        self._check_labels((np.shape(outputs[name])[self.axis], name))
        return float((pred == self.labels).mean())

    def _check_labels(self, classes: tuple[int, str] | None) -> None:
        """Refuses a label below 0 or (``classes``: the count and the output) not below the class count."""
        bad = self.labels < 0 if classes is None else (self.labels < 0) | (self.labels >= classes[0])
        if not bad.any():
            return
        position = tuple(int(i) for i in np.argwhere(bad)[0])
        where = f"sample {position[0]}" if len(position) == 1 else f"position {position}"
        valid = "from 0" if classes is None else \
            f"0 to {classes[0] - 1} (output {classes[1]!r} has {classes[0]})"
        of = f" ({self.origin})" if self.origin else ""
        raise DataError(f"Accuracy labels{of}: {where} has label {int(self.labels[position])}, but labels "
                        f"are class indices {valid}; {int(bad.sum())} label(s) are out of range. Fix the "
                        "labels, or pick the array that holds them.")


class OutputFunction(TaskMetric):
    """A user function of the outputs, e.g. retrieval recall computed from embeddings.

    Args:
        fn: ``fn(outputs, reference) -> float``, both mappings of output name -> array with every
            evaluation sample on axis 0 (the first samples only when the output-space ranking
            scores a leading part of the data: a function holding per-sample data, e.g. labels,
            cuts it to ``len`` of the outputs).
        name: Label for reports.
        higher_is_better: Direction of the metric.
    """

    identity_attrs = ("fn",)

    def __init__(self, fn: Callable[[Outputs, Outputs], float], name: str = "task_metric",
                 higher_is_better: bool = True) -> None:
        self.fn = fn
        self.name = name
        self.higher_is_better = higher_is_better

    def from_outputs(self, outputs: Outputs, reference: Outputs) -> float:
        """Returns ``fn(outputs, reference)`` as a float.

        Raises:
            DataError: The function returned something that is not a finite number.
        """
        return _finite(self.fn(outputs, reference), f"task metric {self.name!r}")


class ModelFunction(TaskMetric):
    """A user function of a model file (for metrics that run their own pipeline).

    Args:
        fn: ``fn(path) -> float`` where ``path`` is the variant's ``.onnx`` file.
        name: Label for reports.
        higher_is_better: Direction of the metric.
    """

    needs_model = True

    identity_attrs = ("fn",)

    def __init__(self, fn: Callable[[Path], float], name: str = "task_metric",
                 higher_is_better: bool = True) -> None:
        self.fn = fn
        self.name = name
        self.higher_is_better = higher_is_better

    def from_model(self, path: Path) -> float:
        """Returns ``fn(path)`` as a float."""
        return _finite(self.fn(path), f"task metric {self.name!r}")


class CommandMetric(TaskMetric):
    """A shell-free command whose last printed line is the metric, e.g. ``python eval.py {model}``.

    The command line is split with :func:`shlex.split`; ``{model}`` inside any argument is replaced
    by the variant's path, so paths with spaces stay one argument.

    Args:
        command: The command line; must contain ``{model}``.
        higher_is_better: Direction of the metric.
        timeout: Seconds before the command is killed (None: no limit).
        cwd: Working directory of the command (None: the current one).
        deps: Files the command reads that it does not name (a module its script imports, a
            config), relative to ``cwd``: like the files it names, they are inputs, and a resumed
            run checks that their contents did not change.

    Raises:
        ConfigError: The command is empty, cannot be split, lacks ``{model}``, names a program
            path that is a folder or not executable, or a dependency is not an existing file.
    """

    needs_model = True

    def __init__(self, command: str, higher_is_better: bool = True, timeout: float | None = None,
                 cwd: str | os.PathLike | None = None, deps: Sequence[str | os.PathLike] = ()) -> None:
        try:
            argv = shlex.split(command)
        except ValueError as err:
            raise ConfigError(f"Cannot parse the evaluation command {command!r}: {err}.") from err
        if not argv:
            raise ConfigError("The evaluation command is empty; give e.g. 'python eval.py {model}'.")
        if not any(MODEL_PLACEHOLDER in arg for arg in argv):
            raise ConfigError(f"The evaluation command {command!r} does not contain {{model}}; put "
                              "{model} where the model path goes, e.g. 'python eval.py {model}'.")
        _check_program(argv[0], cwd, command)
        self.command = command
        self.argv: Sequence[str] = argv
        self.higher_is_better = higher_is_better
        self.timeout = timeout
        self.cwd = cwd
        self.name = os.path.basename(argv[0]) if len(argv) == 1 else "command"
        self.deps = tuple(_check_dep(dep, cwd) for dep in deps)

    def identity(self) -> str:
        """The direction, the argument vector and the absolute working directory it runs in."""
        cwd = os.path.abspath(self.cwd if self.cwd is not None else os.getcwd())
        return "|".join([f"{type(self).__module__}.{type(self).__qualname__}", self.describe(),
                         f"argv={list(self.argv)!r}", f"cwd={cwd!r}"])

    def files(self) -> tuple[Path, ...]:
        """The existing files the command names (the program given as a path, its script, its data,
        an ``--opt=FILE`` value), then its ``deps``, resolved against its working directory, in
        order, each once.

        They are inputs of every run: never written by a command, and part of a resume identity.
        """
        base = self._base()
        found: dict[Path, None] = {}
        for arg in self.argv:
            if MODEL_PLACEHOLDER in arg:
                continue
            for candidate in (arg, arg.partition("=")[2]):
                path = base / candidate if candidate else None
                if path is not None and path.is_file():
                    found[path.resolve()] = None
        for dep in self.deps:
            found[(base / dep).resolve()] = None
        return tuple(found)

    def ingredients(self) -> dict[str, str]:
        """The identity, and the contents of every file of :meth:`files` (each its own ingredient,
        named by its path, so a refused resume says which file changed)."""
        found = super().ingredients()
        base = self._base()
        for path in self.files():
            shown = os.path.relpath(path, base) if path.is_relative_to(base) else str(path)
            found[f"evaluation command's file {shown!r}"] = file_digest(path)
        return found

    def _base(self) -> Path:
        return Path(self.cwd if self.cwd is not None else os.getcwd()).resolve()

    def from_model(self, path: Path) -> float:
        """Runs the command on ``path`` and parses its last printed line.

        Raises:
            BackendError: The command is missing, times out, exits non-zero, or its last
                printed line is not a finite number.
        """
        argv = [arg.replace(MODEL_PLACEHOLDER, str(path)) for arg in self.argv]
        try:
            done = run_in_own_group(argv, self.timeout, self.cwd)
        except FileNotFoundError as err:
            raise BackendError(f"Evaluation command {self.command!r}: program {argv[0]!r} "
                               "not found.") from err
        except PermissionError as err:
            raise BackendError(f"Evaluation command {self.command!r}: {argv[0]!r} is not executable; "
                               f"make it executable (chmod +x) or run it through its interpreter, e.g. "
                               f"'python {argv[0]} {{model}}'.") from err
        except subprocess.TimeoutExpired as err:
            raise BackendError(f"Evaluation command {self.command!r} timed out after "
                               f"{self.timeout} s.") from err
        except ChildProcessError as err:
            raise BackendError(f"Evaluation command {self.command!r}: {err}.") from err
        if done.returncode != 0:
            tail = _last_line(done.stderr) or _last_line(done.stdout) or "no output"
            raise BackendError(f"Evaluation command {self.command!r} exited with status {done.returncode}: "
                               f"{tail}")
        return parse_metric_line(done.stdout, self.command)


def _check_program(program: str, cwd: str | os.PathLike | None, command: str) -> None:
    """Refuses, before any work, a program given as a path that is a folder or not executable."""
    if os.sep not in program:
        return  # looked up on PATH when it runs
    path = Path(cwd or ".") / program
    if path.is_dir() or (path.exists() and not os.access(path, os.X_OK)):
        raise ConfigError(f"Evaluation command {command!r}: {program!r} is not an executable file; make "
                          f"it executable (chmod +x) or run it through its interpreter, e.g. "
                          f"'python {program} {{model}}'.")


def _check_dep(dep: str | os.PathLike, cwd: str | os.PathLike | None) -> Path:
    """An evaluation dependency, refused up front unless it is an existing file."""
    path = Path(cwd or ".") / dep
    if not path.is_file():
        what = "a folder" if path.is_dir() else "not an existing file"
        raise ConfigError(f"Evaluation dependency {os.fspath(dep)!r} is {what}; name each file the "
                          "evaluation command reads (--evaluate-deps FILE ...).")
    return Path(dep)


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def parse_metric_line(stdout: str, command: str) -> float:
    """Returns the number on the last non-empty line of ``stdout``.

    Args:
        stdout: What the command printed.
        command: The command, for the message.

    Returns:
        The metric.

    Raises:
        BackendError: No output, or the last line is not a finite number.
    """
    line = _last_line(stdout)
    if not line:
        raise BackendError(f"Evaluation command {command!r} printed nothing; it must print the task "
                           "metric as its last line.")
    try:
        value = float(line)
    except ValueError:
        raise BackendError(f"Evaluation command {command!r}: last printed line {line[:80]!r} is not a "
                           "number; print the task metric alone on the last line.") from None
    if not math.isfinite(value):
        raise BackendError(f"Evaluation command {command!r} printed {line!r}; the task metric "
                           "must be finite.")
    return value


def _finite(value: Any, what: str) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise DataError(f"{what} returned {value!r}, not a number.") from None
    if not math.isfinite(number):
        raise DataError(f"{what} returned {number}; a task metric must be finite.")
    return number


def as_task_metric(metric: TaskMetric | MetricName) -> TaskMetric:
    """Turns an output-metric name (``"sqnr"``, ``"cosine"``, ...) into a TaskMetric.

    Raises:
        ConfigError: Neither a TaskMetric nor a known output-metric name.
    """
    if isinstance(metric, TaskMetric):
        return metric
    if isinstance(metric, str):
        return OutputMetric(check_metric_name(metric))
    raise ConfigError(f"metric must be a TaskMetric or an output-metric name, got {type(metric).__name__}.")


def concat_batches(batches: Sequence[Mapping[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Concatenates per-batch output dicts on axis 0 (0-d outputs are stacked)."""
    if not batches:
        return {}
    return {name: (np.concatenate([b[name] for b in batches]) if np.ndim(batches[0][name])
                   else np.stack([b[name] for b in batches])) for name in batches[0]}


__all__ = ["Accuracy", "CommandMetric", "ModelFunction", "OutputFunction", "OutputMetric", "TaskMetric",
           "Top1Agreement", "as_task_metric", "concat_batches", "parse_metric_line"]
