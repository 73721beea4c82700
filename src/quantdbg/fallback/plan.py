"""The result of a fallback search: the layers to keep out of INT8 (``exclude``), every evaluation, and
the settings ModelOpt and TensorRT need to build the same mixed-precision model
(``quantdbg.fallback_plan/2``)."""
from __future__ import annotations

import logging
import os
import shlex
import typing
from collections.abc import Iterable, Mapping
from dataclasses import MISSING, dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Literal, get_args

import numpy as np

from quantdbg import _display, _json
from quantdbg._json import Serializable
from quantdbg.backends.tensorrt import (
    BuildCommands,
    EngineBuildSpec,
    ShapeRange,
    build_commands,
    trtexec_command,
)
from quantdbg.config import Precision
from quantdbg.data import as_data
from quantdbg.errors import FormatError, QuantDbgError
from quantdbg.fallback.target import FallbackTarget
from quantdbg.model import Footprint

logger = logging.getLogger(__name__)

Strategy = Literal["auto", "bisect", "linear"]
"""How the search walks the ranking (see :func:`~quantdbg.fallback.search.search_fallback`)."""
STRATEGIES: tuple[Strategy, ...] = get_args(Strategy)
PlanStatus = Literal["met", "unreachable", "verification_failed", "budget_exhausted"]
"""How a search ended (see :attr:`FallbackPlan.status`)."""
PLAN_STATUSES: tuple[PlanStatus, ...] = get_args(PlanStatus)
Purpose = Literal["search", "group", "prune", "verify"]
"""The phase an evaluation belongs to (see :attr:`FallbackEvaluation.purpose`)."""
PURPOSES: tuple[Purpose, ...] = get_args(Purpose)


@dataclass(frozen=True)
class FallbackEvaluation(Serializable):
    """One call of ``evaluate`` (or of the verification).

    Attributes:
        exclude: The nodes kept out of INT8 in this evaluation, in rank order.
        value: What it returned.
        met: Whether the target held.
        purpose: ``"search"`` (ranked prefixes: gallop, bisection, every layer out of INT8),
            ``"group"`` (group testing), ``"prune"`` (greedy pruning) or ``"verify"``.
        round: Evaluations sharing a round do not depend on each other's results (the gallop's
            prefixes), so a parallel executor may run them together; None when not marked (the
            ranked strategies), and then absent from the JSON form.
    """

    exclude: tuple[str, ...]
    value: float
    met: bool
    purpose: Purpose
    round: int | None = None

    def __json_encode__(self) -> dict[str, Any]:
        # Unmarked evaluations keep the form plans had before rounds existed.
        return {f.name: _json.encode(getattr(self, f.name)) for f in fields(self)
                if f.name != "round" or self.round is not None}


def phase_counts(evaluations: Iterable[FallbackEvaluation]) -> dict[Purpose, int]:
    """Evaluations per phase, in the order the phases first occur."""
    counts: dict[Purpose, int] = {}
    for e in evaluations:
        counts[e.purpose] = counts.get(e.purpose, 0) + 1
    return counts


@dataclass(frozen=True)
class TensorRTSettings(Serializable):
    """What a TensorRT build of the mixed-precision model needs.

    The trtexec command lines come from :func:`quantdbg.backends.tensorrt.trtexec_command`. The
    JSON form (the plan's ``tensorrt`` section) spells the settings out for both builds: strongly
    typed, builder flags, layer precisions and the two trtexec command lines.

    Attributes:
        exclude: The nodes kept out of INT8 (TensorRT names the layers of an ONNX model after its
            nodes).
        precision: What they compute in.
    """

    exclude: tuple[str, ...]
    precision: Precision

    def __post_init__(self) -> None:
        object.__setattr__(self, "precision", Precision(self.precision))

    @property
    def strongly_typed(self) -> bool:
        """The build is strongly typed: precisions come from the graph (Q/DQ pairs are INT8,
        excluded nodes compute in what the model's casts say)."""
        return True

    @property
    def builder_flags(self) -> tuple[str, ...]:
        """For a weakly typed build instead: the precisions to enable."""
        return ("int8", self.precision.value)

    @property
    def layer_precisions(self) -> dict[str, str]:
        """For a weakly typed build: excluded node -> precision (``--layerPrecisions`` together
        with ``--precisionConstraints=obey``)."""
        return {node: self.precision.value for node in self.exclude}

    def spec(self, onnx_path: str | os.PathLike = "MIXED.onnx") -> EngineBuildSpec:
        """The engine build of the mixed model at ``onnx_path`` (no profile, engine or cache)."""
        return EngineBuildSpec(Path(onnx_path), exclude=self.exclude, exclude_precision=self.precision)

    def trtexec_args(self, onnx_path: str | os.PathLike = "MIXED.onnx",
                     strongly_typed: bool = True) -> list[str]:
        """The trtexec arguments of the build (weakly typed when ``strongly_typed`` is False)."""
        return shlex.split(trtexec_command(self.spec(onnx_path), strongly_typed=strongly_typed))

    def __json_encode__(self) -> dict[str, Any]:
        return {"strongly_typed": self.strongly_typed, "builder_flags": list(self.builder_flags),
                "layer_precisions": self.layer_precisions,
                "trtexec": trtexec_command(self.spec()),
                "trtexec_weakly_typed": trtexec_command(self.spec(), strongly_typed=False)}

    @classmethod
    def __json_decode__(cls, data: Any, where: str) -> TensorRTSettings:
        if not isinstance(data, dict):
            raise _json.fail(where, "an object (TensorRTSettings)", data)
        flags = _json.decode(tuple[str, ...], data.get("builder_flags", ()), _at(where, "builder_flags"))
        layers = _json.decode(Mapping[str, str], data.get("layer_precisions", {}),
                              _at(where, "layer_precisions"))
        precision = flags[-1] if flags else Precision.FP16.value
        return _json.construct(cls, {"exclude": tuple(layers), "precision": precision}, where)


def _at(where: str, name: str) -> str:
    return f"{where}.{name}" if where else name


@_json.document("quantdbg.fallback_plan", 2)
@dataclass(frozen=True, repr=False)
class FallbackPlan(_display.Displayable, Serializable):
    """The result of a fallback search (the ``quantdbg.fallback_plan/2`` document).

    Attributes:
        status: ``"met"``; ``"unreachable"`` (even every ranked node out of INT8 misses the target,
            or the budget ran out before any set met it; ``value`` is the best achieved);
            ``"verification_failed"`` (the search's set passed but the verification run of the final
            model did not); ``"budget_exhausted"`` (the budget ran out before the set was minimal:
            ``exclude`` is the smallest passing set seen, and it passed the verification).
        exclude: Nodes to keep out of INT8, in rank order (ModelOpt's ``nodes_to_exclude``).
        target: The target.
        value: The verified value of the final set (the best value seen when unreachable).
        strategy: Search strategy used.
        ranking: The ranking searched, most sensitive first.
        evaluations: Every evaluation, in order, the verification last.
        budget: Maximum number of search/prune evaluations allowed.
        minimal: True when no single node of ``exclude`` can be dropped (every removal was seen,
            or follows by monotonicity, to miss the target).
        precision: Precision the excluded nodes compute in.
        message: One human-readable sentence on the outcome.
        build: Once the mixed model is written: the TensorRT engine build of it
            (:class:`quantdbg.backends.tensorrt.EngineBuildSpec` and its trtexec / Polygraphy
            commands, as JSON-ready dicts), else None.
        footprint: The model's weight bytes and the process's peak RSS when the result was made
            (None in files written before it was recorded).
        metric: The name of the metric the values are (``"sqnr"``: output SQNR in dB; None in files
            written before it was recorded, and for searches with a bare ``evaluate``).
    """

    status: PlanStatus
    exclude: tuple[str, ...]
    target: FallbackTarget
    value: float
    strategy: Strategy
    ranking: tuple[str, ...]
    evaluations: tuple[FallbackEvaluation, ...]
    budget: int
    minimal: bool
    precision: Precision = Precision.FP16
    message: str = ""
    build: Mapping[str, Any] | None = None
    footprint: Footprint | None = field(default=None, compare=False, metadata=_json.optional())
    metric: str | None = field(default=None, metadata=_json.optional())

    @property
    def n_evaluations(self) -> int:
        """Full evaluations made by the search (verification excluded)."""
        return sum(1 for e in self.evaluations if e.purpose != "verify")

    @property
    def phases(self) -> dict[Purpose, int]:
        """Evaluations per phase (verification included), in the order the phases first occur."""
        return phase_counts(self.evaluations)

    @property
    def tensorrt(self) -> TensorRTSettings:
        """Settings for a TensorRT build of the mixed model."""
        return TensorRTSettings(self.exclude, self.precision)

    def with_precision(self, precision: Precision) -> FallbackPlan:
        """The same plan with another precision for the excluded nodes."""
        return replace(self, precision=Precision(precision))

    def with_build(self, model_path: str | os.PathLike, data: Any = None, *,
                   source: str | os.PathLike | None = None,
                   calibration_data: str | os.PathLike | None = None,
                   staged: str | os.PathLike | None = None) -> FallbackPlan:
        """The same plan with the TensorRT build of the mixed model written at ``model_path``.

        Args:
            model_path: The mixed-precision model file.
            data: Feeds whose shapes give the optimization profile of dynamic inputs (e.g. the
                evaluation data); None uses batch 1/8/32 for batch-only dynamic inputs.
            source: The FP32 original, for ModelOpt's command (None: no ModelOpt command).
            calibration_data: The calibration .npz, for ModelOpt's command.
            staged: Where the model file is now, when it is moved to ``model_path`` together with
                the plan (None: it is at ``model_path``).

        Returns:
            The plan with :attr:`build` set (unchanged when no profile can be derived; the reason
            is logged).
        """
        path = Path(model_path)
        try:
            spec = EngineBuildSpec.from_model(path, shapes=_profile_from(data), staged=staged,
                                              engine=path.with_suffix(".engine"), exclude=self.exclude,
                                              exclude_precision=self.precision)
        except QuantDbgError as err:
            logger.warning("no TensorRT build commands in the plan: %s", err)
            return self
        commands = build_commands(spec, source, calibration_data)
        return replace(self, build={"spec": spec.to_dict(), "commands": commands.to_dict()})

    @property
    def commands(self) -> BuildCommands:
        """The build commands: those of :attr:`build` once the mixed model is written, else the same
        commands for a model at the placeholder path ``MIXED.onnx``."""
        if self.build is not None:
            return BuildCommands.from_dict(self.build["commands"])
        return build_commands(replace(self.tensorrt.spec(), engine=Path("MIXED.engine")))

    @property
    def mixed_path(self) -> Path:
        """The mixed model the build commands read (``MIXED.onnx`` until :meth:`with_build`)."""
        return Path(self.build["spec"]["model"]) if self.build is not None else Path("MIXED.onnx")

    def __json_encode__(self) -> dict[str, Any]:
        # The build goes in the derived "tensorrt" section, beside ModelOpt's settings (whose own
        # argument name for the excluded nodes is nodes_to_exclude).
        out = {f.name: _json.encode(getattr(self, f.name)) for f in fields(self)
               if f.name != "build" and _json.stored(self, f)}
        # Once built, the command lines name the real files (plans read back keep what they said).
        written = self.build.get("commands", {}) if self.build is not None else {}
        tensorrt = {**_json.encode(self.tensorrt), "build": _json.encode(self.build)}
        modelopt: dict[str, Any] = {"nodes_to_exclude": list(self.exclude)}
        for section, key, name in ((tensorrt, "trtexec", "trtexec"),
                                   (tensorrt, "trtexec_weakly_typed", "trtexec_weakly_typed"),
                                   (modelopt, "command", "modelopt")):
            if written.get(name):
                section[key] = written[name]
        return {**out, "n_evaluations": self.n_evaluations, "modelopt": modelopt, "tensorrt": tensorrt}

    @classmethod
    def __json_decode__(cls, data: Any, where: str) -> FallbackPlan:
        if not isinstance(data, dict):
            raise _json.fail(where, "an object (FallbackPlan)", data)
        stored = [f for f in fields(cls) if f.name != "build"]
        for f in stored:
            if f.name not in data and f.default is MISSING:
                raise FormatError(f"field {_at(where, f.name)!r} is missing")
        hints = typing.get_type_hints(cls)
        values = {f.name: _json.decode(hints[f.name], data[f.name], _at(where, f.name))
                  for f in stored if f.name in data}
        tensorrt = data.get("tensorrt")
        build = tensorrt.get("build") if isinstance(tensorrt, dict) else None
        values["build"] = _json.decode(hints["build"], build, _at(where, "tensorrt.build"))
        return _json.construct(cls, values, where)


def _profile_from(data: Any) -> dict[str, ShapeRange]:
    """Min / opt (first feed) / max shapes of every input over the feeds of ``data``."""
    if data is None:
        return {}
    shapes: dict[str, list[tuple[int, ...]]] = {}
    for feed in as_data(data):
        for name, value in feed.items():
            shapes.setdefault(name, []).append(tuple(int(d) for d in np.shape(value)))
    return {name: ShapeRange(tuple(map(min, zip(*seen, strict=True))), seen[0],
                             tuple(map(max, zip(*seen, strict=True))))
            for name, seen in shapes.items() if len({len(s) for s in seen}) == 1}


__all__ = ["PLAN_STATUSES", "PURPOSES", "STRATEGIES", "FallbackEvaluation", "FallbackPlan", "PlanStatus",
           "Purpose", "Strategy", "TensorRTSettings", "phase_counts"]
