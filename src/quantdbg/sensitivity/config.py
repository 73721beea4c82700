"""What a sensitivity analysis measures and how it runs: the mode vocabulary and SensitivityConfig.

The modes, from cheapest to most faithful:

* ``local``: each layer's own output error when it reads FP32 inputs through its Q/DQ pairs --
  one pass of a graph holding the FP32 model plus a quantized clone per layer (about 2x one FP32
  pass), the cheap ranking for large models;
* ``cumulative``: every intermediate tensor of the fully quantized model against FP32, paired
  through the records and node identities; a layer's score is the noise it adds (output
  noise-to-signal ratio minus that of its inputs), showing where error grows and where it jumps;
* ``isolated``: only that layer's pairs active, everything else FP32 (one pass per layer);
* ``leave-one-out``: everything quantized except that layer (one pass per layer).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, get_args

from quantdbg._json import Serializable, transient
from quantdbg.errors import ConfigError, check_choice
from quantdbg.execution import Executor

Mode = Literal["isolated", "leave-one-out", "local", "cumulative"]
"""A sensitivity analysis mode (see the module docstring)."""

MODES: tuple[Mode, ...] = get_args(Mode)
"""Every mode, for choices lists (the CLI's ``--mode``)."""

EVIDENCE_BATCHES = 2
"""Default batches of the analysis data the calibrator comparison runs on (it needs no full pass)."""

OUTPUT_SAMPLES = 64
"""Default samples of the analysis data (its first batches holding them) each output-space variant
runs on."""

OUTPUT_SPACE_MODES: tuple[Mode, ...] = ("local", "cumulative")
"""Modes that rank by a layer's own error and so get the output-space ranking beside theirs
(isolated / leave-one-out already rank by the model's outputs)."""


@dataclass(frozen=True)
class SensitivityConfig(Serializable):
    """How :func:`~quantdbg.sensitivity.analyze_sensitivity` ranks the quantized layers.

    Attributes:
        mode: ``"local"``, ``"cumulative"``, ``"isolated"`` or ``"leave-one-out"`` (module doc).
        jobs: Processes evaluating isolated / leave-one-out variants in parallel (each with its
            own session).
        evidence: Add the weight / activation / calibrator evidence to every layer.
        evidence_batches: Batches of the data the calibrator comparison of the evidence runs on.
        progress: Show progress bars (else log lines at DEBUG).
        results_path: The analysis' journal (:mod:`quantdbg._journal`): each variant of a sweep
            as it is evaluated, then the report; an analysis interrupted earlier resumes from it,
            a finished one returns its report (:func:`~quantdbg.sensitivity.analyze.finished_report`
            reads it); it must belong to the same models, data, mode and metric. None: nothing is
            written.
        output_samples: Local / cumulative modes: each layer's isolated variant runs on the first
            batches of the data holding at least this many samples, for the output-space ranking
            (one short pass per layer; 0: no output-space ranking; more than the data holds: every
            sample). Counted in samples, so a model fed one sample at a time gets as many.
        executor: Runs the isolated / leave-one-out variants as tasks (e.g. a
            :class:`~quantdbg.execution.RayExecutor`); None: ``jobs`` local processes. Results are
            the same bits as a serial run with the same runners (the default runners give each
            worker an equal share of the cores, and ONNX Runtime's threaded kernels can differ in
            the last bits between thread counts). Not part of the JSON form or of equality.

    Raises:
        ConfigError: Unknown mode, ``jobs`` / ``evidence_batches`` below 1, or ``output_samples`` below 0.
    """

    mode: Mode = "local"
    jobs: int = 1
    evidence: bool = True
    evidence_batches: int = EVIDENCE_BATCHES
    progress: bool = False
    results_path: Path | None = None
    output_samples: int = OUTPUT_SAMPLES
    executor: Executor | None = field(default=None, compare=False, metadata=transient())

    def __post_init__(self) -> None:
        check_choice("sensitivity mode", self.mode, MODES)
        if self.jobs < 1:
            raise ConfigError(f"jobs must be >= 1, got {self.jobs}.")
        if self.evidence_batches < 1:
            raise ConfigError(f"evidence_batches must be >= 1, got {self.evidence_batches}.")
        if self.output_samples < 0:
            raise ConfigError(f"output_samples must be >= 0 (0: no output-space ranking), got "
                              f"{self.output_samples}.")
        if self.results_path is not None:
            object.__setattr__(self, "results_path", Path(self.results_path))


__all__ = ["EVIDENCE_BATCHES", "MODES", "OUTPUT_SAMPLES", "OUTPUT_SPACE_MODES", "Mode", "SensitivityConfig"]
