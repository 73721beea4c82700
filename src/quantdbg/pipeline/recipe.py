"""The flow's decisions as one JSON recipe, and re-applying it to a re-exported model.

A recipe holds what the flow decided, in the order it is applied: cross-layer equalization (when
kept: ``calib.equalize``), SmoothQuant (when kept, with the per-channel ranges it used), the
calibrator choice (the default calibrator and every per-tensor choice kept) with bias correction
(``calib.bias_correction``), the Q/DQ placement, and the layers kept out of INT8. Node and tensor
names are all it refers to, so a model re-exported with the same names gets the same mixed model
from :func:`apply_recipe`, with one calibration pass (two with bias correction) and no evaluation.
A fallback plan that records how its INT8 model was calibrated (``quantdbg fallback`` on an FP32
model) is a recipe too.
"""
from __future__ import annotations

import difflib
import os
from dataclasses import dataclass, field, fields, is_dataclass

from quantdbg import _json
from quantdbg._json import Serializable
from quantdbg.calibration import calibrate, equalize
from quantdbg.calibration.smoothing.apply import apply_smoothing
from quantdbg.config import CalibConfig, Precision, QuantConfig
from quantdbg.data import DataSource, as_model_data
from quantdbg.errors import ConfigError, FormatError, ModelError
from quantdbg.fallback import FallbackPlan
from quantdbg.model import LoadedModel
from quantdbg.model.load import ModelSource, as_loaded
from quantdbg.pipeline.records import RepairRecord, SmoothingStep
from quantdbg.placement import plan_qdq
from quantdbg.qdq import QuantizedModel, insert_qdq, remove_qdq


@_json.document("quantdbg.auto_recipe", 1)
@dataclass(frozen=True)
class AutoRecipe(Serializable):
    """What the automatic flow decided (the ``quantdbg.auto_recipe/1`` document).

    Applied in this order: equalization (``calib.equalize``) -> ``smoothing`` (when kept) ->
    calibration with ``calib`` (bias corrections measured when ``calib.bias_correction``) -> Q/DQ
    pairs placed by ``quant`` -> ``exclude`` out of INT8 in ``precision``.

    Attributes:
        calib: The calibrator choice: the default calibrator, the per-tensor choices kept, and
            whether equalization and bias correction were kept.
        quant: Where Q/DQ pairs go.
        smoothing: SmoothQuant as applied (None when not kept).
        exclude: The layers kept out of INT8, in rank order.
        precision: What they compute in.
        repairs: Every repair tried, in order, with its decision (kept or not, and why).
    """

    calib: CalibConfig = field(default_factory=CalibConfig)
    quant: QuantConfig = field(default_factory=QuantConfig)
    smoothing: SmoothingStep | None = None
    exclude: tuple[str, ...] = ()
    precision: Precision = Precision.FP16
    repairs: tuple[RepairRecord, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "exclude", tuple(self.exclude))
        object.__setattr__(self, "precision", Precision(self.precision))
        object.__setattr__(self, "repairs", tuple(self.repairs))

    @property
    def kept(self) -> tuple[str, ...]:
        """The repairs kept, in the order they were applied."""
        return tuple(r.repair for r in self.repairs if r.kept)

    @property
    def start_choice(self) -> RepairRecord | None:
        """The record of the calibrator choice made the INT8 start (None: the default calibration was)."""
        return next((r for r in self.repairs if r.at_start), None)

    @property
    def kept_after_start(self) -> tuple[str, ...]:
        """The repairs kept after the first INT8 evaluation (not a calibrator choice made the INT8 start)."""
        return tuple(r.repair for r in self.repairs if r.kept and not r.at_start)


RecipeSource = AutoRecipe | FallbackPlan | str | os.PathLike
"""A recipe, a fallback plan that records its calibration, or a file holding either (a result of
``quantdbg auto --plan``, a plan of ``quantdbg fallback --plan``, or a bare recipe)."""


def recipe_of(plan: FallbackPlan, source: str = "the plan") -> AutoRecipe:
    """The recipe a fallback plan describes: its calibration and Q/DQ placement, its layers out of INT8.

    Raises:
        ConfigError: The plan does not record how its INT8 model was calibrated (it came quantized,
            or the file predates that record).
    """
    if plan.calib is None or plan.quant is None:
        raise ConfigError(
            f"{source} is a fallback plan of a model quantized elsewhere (or written before plans recorded "
            "their calibration): it names the layers to keep out of INT8, not how to calibrate the rest. "
            "Write it with `quantdbg fallback FP32.onnx --data CALIB.npz ...` (an FP32 MODEL), or use the "
            "result of `quantdbg auto`.")
    return AutoRecipe(plan.calib, plan.quant, None, plan.exclude, plan.precision)


_RECIPE_FILES = ("give a recipe, the result of `quantdbg auto --plan` or the plan of "
                 "`quantdbg fallback --plan`.")


def read_recipe(path: str | os.PathLike) -> AutoRecipe:
    """Reads a recipe file, the recipe of a result of the flow (``quantdbg auto --plan``), or the
    recipe of a fallback plan (``quantdbg fallback --plan``, :func:`recipe_of`); the codec's registry
    tells which document the file is (:func:`quantdbg._json.detect`).

    Raises:
        FormatError: The file is unreadable, not one of those documents, or holds no valid recipe
            (file and field named).
        ConfigError: A fallback plan that does not record its calibration.
    """
    data = _json.read_json(path)
    source = repr(os.fspath(path))
    try:
        cls = _json.detect(data, source)
    except FormatError as err:
        raise FormatError(f"{err} To apply a recipe, {_RECIPE_FILES}") from None
    if cls is not AutoRecipe and cls is not FallbackPlan and not _carries_recipe(cls):
        raise FormatError(f"{source} holds a {_json.format_of(cls)} document; {_RECIPE_FILES}")
    document = _json.load(cls, data, source)
    if isinstance(document, FallbackPlan):
        return recipe_of(document, source)
    return document if isinstance(document, AutoRecipe) else document.recipe


def _carries_recipe(cls: type) -> bool:
    """Whether a document holds a recipe section (the flow's result)."""
    return is_dataclass(cls) and any(f.name == "recipe" for f in fields(cls))


def _as_recipe(recipe: RecipeSource) -> AutoRecipe:
    if isinstance(recipe, AutoRecipe):
        return recipe
    if isinstance(recipe, FallbackPlan):
        return recipe_of(recipe)
    return read_recipe(recipe)


def check_nodes(model: LoadedModel, recipe: AutoRecipe) -> None:
    """Fails when ``model`` lacks a node the recipe names (renamed by a re-export), naming every one
    with the closest names the model has.

    Raises:
        ModelError: One or more nodes are missing; all are listed in one message.
    """
    migrations = recipe.smoothing.migrations if recipe.smoothing is not None else ()
    smoothed = [name for migration in migrations for name in migration.nodes]
    known = [node.name for node in model.proto.graph.node]
    present = set(known)
    missing = [name for name in dict.fromkeys((*recipe.exclude, *smoothed)) if name not in present]
    if not missing:
        return
    shown = []
    for name in missing:
        near = difflib.get_close_matches(name, known, n=3, cutoff=0.5)
        hint = f"closest: {', '.join(map(repr, near))}" if near else "no close name"
        shown.append(f"{name!r} ({hint})")
    raise ModelError(f"The model lacks {len(missing)} node(s) the plan names (renamed by a re-export?): "
                     f"{'; '.join(shown)}. The plan refers to nodes by name: export with the same node "
                     "names, or run `quantdbg auto` on this model.")


def apply_recipe(model: ModelSource, calib_data: DataSource, recipe: RecipeSource, *,
                 batch_size: int | None = None, progress: bool = False) -> QuantizedModel:
    """Builds the mixed-precision model a recipe or a fallback plan describes (e.g. for a re-exported
    model).

    Args:
        model: The FP32 model; node and tensor names as in the model the recipe was made for.
        calib_data: Calibration data (the same data gives the same scales, whatever the batch size).
        recipe: The recipe, a fallback plan recording its calibration, or a file holding either
            (:func:`read_recipe`).
        batch_size: Samples per calibration feed for arrays and ``.npz`` files (default 32).
        progress: Show a progress bar while calibrating.

    Returns:
        The Q/DQ model with the recipe's layers kept out of INT8 (byte for byte the model the flow or
        the fallback search wrote when the model and data are the same).

    Raises:
        FormatError: The recipe file is not valid.
        ModelError: Nodes the recipe names (smoothed nodes, excluded layers) are not in the model
            (all named, with the closest names).
        DataError: The data does not match the model.
        ConfigError: A calibrator of the recipe is unknown, or a plan that does not record its
            calibration.
    """
    recipe = _as_recipe(recipe)
    fp = as_loaded(model)
    check_nodes(fp, recipe)
    if recipe.calib.equalize:  # the flow equalized before SmoothQuant measured its ranges
        fp = equalize(fp).model
    if recipe.smoothing is not None:
        fp = as_loaded(apply_smoothing(fp, recipe.smoothing.absmax(), recipe.smoothing.config).model)
    plan = plan_qdq(fp, recipe.quant)
    calibration = calibrate(fp, as_model_data(calib_data, fp.proto, batch_size), recipe.calib, plan,
                            progress=progress)
    qmodel = insert_qdq(fp, calibration, recipe.quant, plan=plan)
    return remove_qdq(qmodel, recipe.exclude, recipe.precision) if recipe.exclude else qmodel


__all__ = ["AutoRecipe", "RecipeSource", "apply_recipe", "check_nodes", "read_recipe", "recipe_of"]
