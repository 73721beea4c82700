"""The recipe: its JSON, reading it from a recipe or result file, and re-applying it (SmoothQuant,
per-tensor calibrators, excluded layers) to get the flow's model again."""
from __future__ import annotations

import json
from dataclasses import replace

import models_auto as ma
import models_smoothing as msm
import numpy as np
import pytest

import quantdbg
from quantdbg.config import CalibConfig, Precision, QuantConfig
from quantdbg.errors import ConfigError, FormatError, ModelError
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
    data = result.to_dict()
    bad.write_text(json.dumps({**data, "recipe": {**data["recipe"], "exclude": "fc1"}}))
    with pytest.raises(FormatError, match=r"bad.json'?: not a valid quantdbg.auto/1 document: field "
                                          r"'recipe.exclude': expected a list"):
        read_recipe(bad)


def test_read_recipe_knows_a_file_by_the_codecs_registry(smoothed, tmp_path):
    _, result = smoothed
    assert result.plan is not None and result.plan.calib is None  # the flow's plan: its recipe is beside it
    with pytest.raises(ConfigError, match=r"fallback.json'? is a fallback plan of a model quantized else"):
        read_recipe(result.plan.write(tmp_path / "fallback.json"))
    plan = replace(result.plan, calib=CalibConfig("percentile"), quant=result.recipe.quant)
    assert read_recipe(plan.write(tmp_path / "fallback.json")) == \
        AutoRecipe(plan.calib, plan.quant, None, plan.exclude, plan.precision)
    assert read_recipe(result.write(tmp_path / "auto.json")) == result.recipe
    assert read_recipe(result.recipe.write(tmp_path / "recipe.json")) == result.recipe
    report = result.report.write(tmp_path / "report.json")
    with pytest.raises(FormatError, match=r"report.json'? holds a quantdbg.sensitivity/1 document; "
                                          r"give .*the result of `quantdbg auto --plan` or the plan of "):
        read_recipe(report)
    # a "recipe" key does not make a document one: other documents, unknown tags and untagged
    # objects are refused whatever they hold
    recipe = result.recipe.to_dict()
    for name, data, reason in [
            ("sensitivity", {**result.report.to_dict(), "recipe": recipe}, "holds a quantdbg.sensitivity/1"),
            ("foreign", {"format": "acme.plan/1", "recipe": recipe}, r'not a quantdbg document \(format '
                                                                    r'"acme.plan/1"\); known: .*To apply'),
            ("untagged", {"recipe": recipe}, r"not a quantdbg document \(no 'format' tag\)")]:
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(data))
        with pytest.raises(FormatError, match=reason):
            read_recipe(path)


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
