"""The recipe: its JSON, reading it from a recipe or result file, and re-applying it (SmoothQuant,
per-tensor calibrators, excluded layers) to get the flow's model again."""
from __future__ import annotations

import json

import models_auto as ma
import models_smoothing as msm
import numpy as np
import pytest

import quantdbg
from quantdbg.config import CalibConfig, Precision, QuantConfig
from quantdbg.errors import FormatError, ModelError
from quantdbg.fallback import FallbackConfig, FallbackTarget
from quantdbg.pipeline import AutoConfig, AutoRecipe, SmoothQuantRepairConfig, apply_recipe, read_recipe


@pytest.fixture(scope="module")
def smoothed():
    rng = np.random.default_rng(3)
    data = {"x": rng.standard_normal((32, 5, 8)).astype(np.float32)}
    config = AutoConfig(CalibConfig("minmax"), repairs=("smoothquant", "calibrator"), threads=1,
                        smoothquant=SmoothQuantRepairConfig(min_outlier_ratio=5.0),
                        fallback=FallbackConfig(precision=Precision.FP32))
    return data, quantdbg.auto(msm.ln_ffn(), data, data, FallbackTarget.min_sqnr(60), config=config)


def test_a_recipe_with_smoothquant_rebuilds_the_same_model(smoothed):
    data, result = smoothed
    recipe = result.recipe
    assert recipe.repairs[0].repair == "smoothquant" and recipe.repairs[0].kept
    assert recipe.smoothing is not None and recipe.smoothing.config.nodes == ("q", "k", "up")
    assert AutoRecipe.from_dict(json.loads(json.dumps(recipe.to_dict()))) == recipe
    again = apply_recipe(msm.ln_ffn(), data, recipe, batch_size=5)
    assert again.model.SerializeToString() == result.model.model.SerializeToString()
    assert again.excluded == result.exclude


def test_recipe_files(smoothed, tmp_path):
    _, result = smoothed
    recipe_file = result.recipe.write(tmp_path / "recipe.json")
    assert json.loads(recipe_file.read_text())["format"] == "quantdbg.auto_recipe/1"
    assert read_recipe(recipe_file) == result.recipe
    assert read_recipe(result.write(tmp_path / "plan.json")) == result.recipe
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"recipe": {"format": "quantdbg.auto_recipe/1", "exclude": "fc1"}}))
    with pytest.raises(FormatError, match=r"bad.json'?: not a valid quantdbg.auto_recipe/1 document: field "
                                          r"'exclude': expected a list"):
        read_recipe(bad)


def test_a_recipe_for_other_node_names_is_refused(rng):
    calib = ma.clipped_inputs(rng, 64)
    with pytest.raises(ModelError, match=r"^The model lacks 1 node\(s\) the plan names \(renamed by a "
                                         r"re-export\?\): 'conv9' \(no close name\)\. The plan refers"):
        apply_recipe(ma.clipped_mlp(), calib, AutoRecipe(exclude=("conv9",)))
    with pytest.raises(ModelError, match="matches no node"):
        apply_recipe(ma.clipped_mlp(), calib, AutoRecipe(quant=QuantConfig(exclude=("conv9",))))


def test_an_empty_recipe_is_the_default_quantization(rng):
    calib = ma.clipped_inputs(rng, 64)
    recipe = AutoRecipe()
    assert (recipe.calib, recipe.quant, recipe.exclude, recipe.precision, recipe.kept) == \
        (CalibConfig(), QuantConfig(), (), Precision.FP16, ())
    built = apply_recipe(ma.clipped_mlp(), calib, recipe)
    plain = quantdbg.quantize(ma.clipped_mlp(), calib)
    assert built.model.SerializeToString() == plain.model.SerializeToString()
