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

from quantdbg import _display, _json
from quantdbg._json import Serializable
from quantdbg.backends.tensorrt import BuildCommands, EngineBuildSpec, TrtConfig, build_commands
from quantdbg.backends.tensorrt.commands import layer_precisions_problem, trtexec_command
from quantdbg.config import CalibConfig, Precision, QuantConfig
from quantdbg.data import DataSource
from quantdbg.errors import FormatError, QuantDbgError
from quantdbg.fallback.target import FallbackTarget
from quantdbg.model.footprint import Footprint

logger = logging.getLogger(__name__)

Strategy = Literal["auto", "bisect", "linear"]
"""How the search walks the ranking (see :func:`~quantdbg.fallback.search.search_fallback`): ``"auto"``
is the default that does not trust the ranking (a short gallop, then group testing)."""
STRATEGIES: tuple[Strategy, ...] = get_args(Strategy)
PlanStatus = Literal["met", "unreachable", "verification_failed", "budget_exhausted"]
"""How a search ended (see :attr:`FallbackPlan.status`)."""
PLAN_STATUSES: tuple[PlanStatus, ...] = get_args(PlanStatus)
Purpose = Literal["search", "group", "exchange", "prune", "verify"]
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
            ``"group"`` (group testing), ``"exchange"`` (the search for a smaller set after group
            testing), ``"prune"`` (greedy pruning) or ``"verify"``.
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

    The trtexec command lines come from :func:`quantdbg.backends.tensorrt.commands.trtexec_command`. The
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
        # No weakly typed command when trtexec cannot spell a name (the strongly typed one needs none).
        weakly = "" if layer_precisions_problem(self.exclude) else trtexec_command(self.spec(),
                                                                                   strongly_typed=False)
        return {"strongly_typed": self.strongly_typed, "builder_flags": list(self.builder_flags),
                "layer_precisions": self.layer_precisions, "trtexec": trtexec_command(self.spec()),
                "trtexec_weakly_typed": weakly}

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
            (:class:`quantdbg.backends.tensorrt.EngineBuildSpec`; its JSON form adds the trtexec /
            Polygraphy / ModelOpt commands, which reading ignores: they are rebuilt from the spec),
            else None.
        footprint: The model's weight bytes and the process's peak RSS when the result was made
            (None in files written before it was recorded).
        calib: How the INT8 model the search started from was calibrated, and ``quant`` where its
            Q/DQ pairs went: with both, :func:`quantdbg.pipeline.apply_recipe` re-creates the mixed
            model from an FP32 model and calibration data (None when the model came quantized, or
            in files written before they were recorded).
        quant: See ``calib``.
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
    build: EngineBuildSpec | None = None
    footprint: Footprint | None = field(default=None, compare=False, metadata=_json.optional())
    calib: CalibConfig | None = field(default=None, metadata=_json.optional())
    quant: QuantConfig | None = field(default=None, metadata=_json.optional())
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

    def with_build(self, model_path: str | os.PathLike, data: DataSource | None = None, *,
                   config: TrtConfig | None = None, batch_size: int | None = None, graph: Any = None,
                   **options: Any) -> FallbackPlan:
        """The same plan with the TensorRT build of the mixed model written at ``model_path``.

        Args:
            model_path: The mixed-precision model file.
            data: The evaluation data: the extents of non-batch dynamic axes (and the batch size
                when ``batch_size`` is None).
            config: The build settings and profile (None: the profile rule of
                :meth:`~quantdbg.backends.tensorrt.EngineBuildSpec.from_model`, min 1, opt and max
                ``batch_size``); the engine goes beside the model unless ``config.save_engine`` says.
            batch_size: The batch size the model was calibrated and evaluated with.
            graph: Where the model's inputs are read instead of ``model_path``: the model in memory
                (a ModelProto), or the file it is in until it is moved to ``model_path``.
            **options: Other :class:`~quantdbg.backends.tensorrt.EngineBuildSpec` fields: ``source``
                (the FP32 original, for ModelOpt's command; None: no ModelOpt command),
                ``calibration_data`` (the calibration .npz, for ModelOpt's command), ``layer_info``;
                ``exclude`` and ``exclude_precision`` default to the plan's (a model with another set
                excluded names its own).

        Returns:
            The plan with :attr:`build` set (unchanged when no profile can be derived or a tool cannot
            spell an input's name; the reason is logged).
        """
        path = Path(model_path)
        try:
            spec = EngineBuildSpec.from_model(path, config, data=data, batch_size=batch_size, graph=graph,
                                              **{"exclude": self.exclude, "exclude_precision": self.precision,
                                                 **options})
            spec = spec.engine_beside()
            build_commands(spec)  # refuses input names no tool can spell, before the plan holds them
        except QuantDbgError as err:
            logger.warning("no TensorRT build commands in the plan: %s", err)
            return self
        return replace(self, build=spec)

    def located(self, model_path: str | os.PathLike, **files: str | os.PathLike) -> FallbackPlan:
        """The same plan, its build (if any) naming the model at ``model_path`` and the engine beside it
        (for a model saved somewhere else than the build said); ``files`` sets the build's
        ``source`` and ``calibration_data`` (ModelOpt's inputs)."""
        if self.build is None:
            return self
        config = replace(self.build.config, save_engine=None)
        spec = replace(self.build, model=Path(model_path), config=config, **files)  # type: ignore[arg-type]
        return replace(self, build=spec.engine_beside())

    @property
    def commands(self) -> BuildCommands:
        """The build commands, made from :attr:`build` once the mixed model is written, else the same
        commands for a model at the placeholder path ``MIXED.onnx``."""
        if self.build is not None:
            return build_commands(self.build)
        return build_commands(self.tensorrt.spec().engine_beside())

    @property
    def mixed_path(self) -> Path:
        """The mixed model the build commands read (``MIXED.onnx`` until :meth:`with_build`)."""
        return self.build.model if self.build is not None else Path("MIXED.onnx")

    def __json_encode__(self) -> dict[str, Any]:
        # The build goes in the derived "tensorrt" section, beside ModelOpt's settings (whose own
        # argument name for the excluded nodes is nodes_to_exclude).
        out = {f.name: _json.encode(getattr(self, f.name)) for f in fields(self)
               if f.name != "build" and _json.stored(self, f)}
        # Once built, the command lines name the real files; they are written for readers and rebuilt
        # from the spec when read back, never replayed from the file.
        written = self.commands.to_dict() if self.build is not None else {}
        build = None if self.build is None else {"spec": self.build.to_dict(), "commands": written}
        tensorrt = {**_json.encode(self.tensorrt), "build": build}
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
        if build is not None and not isinstance(build, dict):
            raise _json.fail(_at(where, "tensorrt.build"), "an object with a spec, or null", build)
        spec = None if build is None else build.get("spec")
        values["build"] = _json.decode(hints["build"], spec, _at(where, "tensorrt.build.spec"))
        return _json.construct(cls, values, where)


__all__ = ["PLAN_STATUSES", "PURPOSES", "STRATEGIES", "FallbackEvaluation", "FallbackPlan", "PlanStatus",
           "Purpose", "Strategy", "TensorRTSettings", "phase_counts"]
