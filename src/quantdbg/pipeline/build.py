"""The build of the flow's final model: its plan holds the trtexec / Polygraphy / ModelOpt commands.

:func:`quantdbg.auto` returns the result with them, so a Python caller gets what ``quantdbg auto``
prints: the commands name the model at :data:`MODEL_PLACEHOLDER` until the caller says where it saved
it (:meth:`~quantdbg.pipeline.AutoResult.located`). When INT8 alone meets the target (no search ran)
the plan still comes, with no layer excluded, so the INT8 model gets its build commands too.
"""
from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

from quantdbg.data import DEFAULT_BATCH_SIZE, DataSource
from quantdbg.fallback import FallbackPlan
from quantdbg.model.load import ModelSource
from quantdbg.pipeline.config import AutoConfig
from quantdbg.pipeline.result import AutoResult

MODEL_PLACEHOLDER = Path("MIXED.onnx")
"""The final model's path in the build commands until the caller saves it somewhere."""


def with_build(result: AutoResult, model: ModelSource, calib_data: DataSource, eval_data: DataSource,
               config: AutoConfig) -> AutoResult:
    """``result`` whose plan (one with no layer excluded when no search ran) holds the build of the
    final model: its excluded layers, the profile rule or ``config.engine``, and ModelOpt's command
    when the FP32 model (and the calibration data) were given as files.

    Args:
        result: The flow's result, with its final model.
        model: The FP32 model as the caller gave it.
        calib_data: The calibration data as the caller gave it.
        eval_data: The evaluation data (extents of non-batch dynamic axes).
        config: The flow's settings (``batch_size``, ``engine``).

    Returns:
        The result with ``plan.build`` set (unchanged when the model has no final model, or when no
        profile can be worked out: the plan's builder logs why).
    """
    if result.model is None:
        return result
    plan = result.plan if result.plan is not None else _no_search_plan(result, config)
    built = plan.with_build(MODEL_PLACEHOLDER, eval_data, config=config.engine,
                            batch_size=config.batch_size or DEFAULT_BATCH_SIZE, graph=result.model.model,
                            exclude=result.exclude, exclude_precision=result.recipe.precision,
                            source=_file(model), calibration_data=_file(calib_data))
    return replace(result, plan=built)


def _file(source: object) -> Path | None:
    return Path(source) if isinstance(source, (str, os.PathLike)) else None


def _no_search_plan(result: AutoResult, config: AutoConfig) -> FallbackPlan:
    """The plan of a result no search was needed for: every layer in INT8, the final value verified."""
    message = (f"No search needed: the INT8 model meets {result.target.describe()} ({result.metric} "
               f"{result.final_value:.4g}); every layer stays in INT8.")
    return FallbackPlan("met", (), result.target, result.final_value, config.fallback.strategy, (), (), 0,
                        True, result.recipe.precision, message)


__all__ = ["MODEL_PLACEHOLDER", "with_build"]
