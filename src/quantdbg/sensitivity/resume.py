"""The results file of a sweep: its progress after every variant, then the finished report.

An isolated / leave-one-out sweep rewrites the file atomically after every variant (a
``quantdbg.sensitivity-progress/1`` document); the finished analysis replaces it with the
``quantdbg.sensitivity/1`` report. Both carry the fingerprint of the models, data, mode and metric,
so a file of another analysis is refused instead of resumed.
"""
from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from quantdbg import _json
from quantdbg._fingerprint import differences
from quantdbg._json import Serializable
from quantdbg.errors import ConfigError, FormatError
from quantdbg.sensitivity.config import Mode
from quantdbg.sensitivity.evaluator import VariantResult
from quantdbg.sensitivity.report import SensitivityReport

logger = logging.getLogger(__name__)


@_json.document("quantdbg.sensitivity-progress", 1)
@dataclass(frozen=True)
class SweepProgress(Serializable):
    """The variants a sweep has evaluated so far.

    Attributes:
        fingerprint: The analysis' fingerprint (see ``VariantEvaluator.fingerprint``).
        mode: The sweep's mode.
        done: Variant name (a layer, or ``__all_quantized__``) -> its result.
    """

    fingerprint: str
    mode: Mode
    done: Mapping[str, VariantResult]


class ResultsFile:
    """The resumable progress of a sweep, rewritten atomically after every variant.

    Args:
        path: The file (None: nothing is read or written).
        fingerprint: The analysis' fingerprint.
        mode: The analysis mode.
    """

    def __init__(self, path: Path | None, fingerprint: str, mode: Mode) -> None:
        self.path = path
        self.fingerprint = fingerprint
        self.mode = mode
        self.done: dict[str, VariantResult] = {}
        self.report: SensitivityReport | None = None

    @classmethod
    def open(cls, path: str | os.PathLike | None, fingerprint: str, mode: Mode) -> ResultsFile:
        """Reads what an earlier run of the same analysis left in ``path`` (nothing when absent).

        Raises:
            ConfigError: The file belongs to another analysis.
            FormatError: The file is unreadable or not a progress file or report.
        """
        state = cls(None if path is None else Path(path), fingerprint, mode)
        if state.path is None or not state.path.exists():
            return state
        try:
            data = _json.read_json(state.path)
            if not isinstance(data, dict):
                raise FormatError(f"{str(state.path)!r} holds {type(data).__name__}, not a progress "
                                  "file or report.")
            if data.get("fingerprint") != fingerprint:
                raise ConfigError(f"Results file {str(state.path)!r} belongs to another analysis: "
                                  f"{differences(data.get('fingerprint'), fingerprint)}; delete it to start "
                                  "afresh, or choose another results path.")
            if data.get("format") == _json.format_of(SensitivityReport):
                state.report = SensitivityReport.from_dict(data, repr(str(state.path)))
            else:
                state.done = dict(SweepProgress.from_dict(data, repr(str(state.path))).done)
                logger.info("resuming %s sweep: %d variant(s) already done", mode, len(state.done))
        except FormatError as err:
            raise FormatError(f"Cannot resume the sweep: {err} Or delete the file, or choose another "
                              "results path.") from err
        return state

    def record(self, name: str, result: VariantResult) -> None:
        """Adds a variant's result and rewrites the file."""
        self.done[name] = result
        if self.path is not None:
            SweepProgress(self.fingerprint, self.mode, dict(self.done)).write(self.path)


__all__ = ["ResultsFile", "SweepProgress"]
