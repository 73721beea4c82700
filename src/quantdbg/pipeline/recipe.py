"""The flow's decisions as one JSON recipe, and re-applying it to a re-exported model.

A recipe holds what the flow decided, in the order it is applied: cross-layer equalization (when
kept: ``calib.equalize``), SmoothQuant (when kept, with the per-channel ranges it used), the
calibrator choice (the default calibrator and every per-tensor choice kept) with bias correction
(``calib.bias_correction``), the Q/DQ placement, and the layers kept out of INT8. Node and tensor
names are all it refers to, so a model re-exported with the same names gets the same mixed model
from :func:`apply_recipe`, with one calibration pass (two with bias correction) and no evaluation.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

from quantdbg import _json
from quantdbg._json import Serializable
from quantdbg.calibration import apply_smoothing, calibrate, equalize
from quantdbg.config import CalibConfig, Precision, QuantConfig
from quantdbg.data import DataSource, as_model_data
from quantdbg.model import ModelSource, as_loaded
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


def read_recipe(path: str | os.PathLike) -> AutoRecipe:
    """Reads a recipe file, or the recipe section of a result file of the flow (``quantdbg auto --plan``).

    Raises:
        FormatError: The file is unreadable or holds no valid recipe (file and field named).
    """
    data = _json.read_json(path)
    if isinstance(data, dict) and isinstance(data.get("recipe"), dict):
        data = data["recipe"]
    return AutoRecipe.from_dict(data, repr(os.fspath(path)))


def apply_recipe(model: ModelSource, calib_data: DataSource, recipe: AutoRecipe | str | os.PathLike, *,
                 batch_size: int | None = None, progress: bool = False) -> QuantizedModel:
    """Builds the mixed-precision model a recipe describes (e.g. for a re-exported model).

    Args:
        model: The FP32 model; node and tensor names as in the model the recipe was made for.
        calib_data: Calibration data (the same data gives the same scales, whatever the batch size).
        recipe: The recipe, or a file holding it (:func:`read_recipe`).
        batch_size: Samples per calibration feed for arrays and ``.npz`` files (default 32).
        progress: Show a progress bar while calibrating.

    Returns:
        The Q/DQ model with the recipe's layers kept out of INT8 (the same model the flow returned
        when the model and data are the same).

    Raises:
        FormatError: The recipe file is not valid.
        ModelError: A name of the recipe (a smoothed node, an excluded layer) is not in the model.
        DataError: The data does not match the model.
        ConfigError: A calibrator of the recipe is unknown.
    """
    if not isinstance(recipe, AutoRecipe):
        recipe = read_recipe(recipe)
    fp = as_loaded(model)
    if recipe.calib.equalize:  # the flow equalized before SmoothQuant measured its ranges
        fp = equalize(fp).model
    if recipe.smoothing is not None:
        fp = as_loaded(apply_smoothing(fp, recipe.smoothing.absmax(), recipe.smoothing.config).model)
    plan = plan_qdq(fp, recipe.quant)
    calibration = calibrate(fp, as_model_data(calib_data, fp.proto, batch_size), recipe.calib, plan,
                            progress=progress)
    qmodel = insert_qdq(fp, calibration, recipe.quant, plan=plan)
    return remove_qdq(qmodel, recipe.exclude, recipe.precision) if recipe.exclude else qmodel


__all__ = ["AutoRecipe", "apply_recipe", "read_recipe"]
