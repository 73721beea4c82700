"""The automatic flow: calibrate, repair INT8, rank, search the fewest layers to keep out of INT8,
verify and report, in one call (``quantdbg.auto(...)``, ``quantdbg auto``).

``config`` (:class:`AutoConfig`, the repair vocabulary) -> ``records`` (what the repairs decided) ->
``context`` (the data, metric, the journal of finished passes and evaluations, and the
models on the way) -> ``repairs`` (the INT8 repairs, each a pass with a frozen config and an
``apply``) -> ``recipe`` (the decisions as JSON, :func:`apply_recipe`) -> ``result``
(:class:`AutoResult`) -> ``flow`` (:func:`auto`).

``quantdbg.auto(model, calib, evals, target)`` is :func:`auto`; :func:`apply_recipe` re-applies a
recipe to a re-exported model.
"""
from __future__ import annotations

from quantdbg._exports import public_names as _public_names
from quantdbg.pipeline.config import MET_OUTCOMES as MET_OUTCOMES
from quantdbg.pipeline.config import OUTCOMES as OUTCOMES
from quantdbg.pipeline.config import PHASES as PHASES
from quantdbg.pipeline.config import REPAIRS as REPAIRS
from quantdbg.pipeline.config import AutoConfig as AutoConfig
from quantdbg.pipeline.config import BiasCorrectionRepairConfig as BiasCorrectionRepairConfig
from quantdbg.pipeline.config import CalibratorRepairConfig as CalibratorRepairConfig
from quantdbg.pipeline.config import EqualizeRepairConfig as EqualizeRepairConfig
from quantdbg.pipeline.config import Outcome as Outcome
from quantdbg.pipeline.config import Phase as Phase
from quantdbg.pipeline.config import Repair as Repair
from quantdbg.pipeline.config import SmoothQuantRepairConfig as SmoothQuantRepairConfig
from quantdbg.pipeline.context import AutoContext as AutoContext
from quantdbg.pipeline.context import Stage as Stage
from quantdbg.pipeline.flow import auto as auto
from quantdbg.pipeline.recipe import AutoRecipe as AutoRecipe
from quantdbg.pipeline.recipe import apply_recipe as apply_recipe
from quantdbg.pipeline.recipe import read_recipe as read_recipe
from quantdbg.pipeline.recipe import recipe_of as recipe_of
from quantdbg.pipeline.records import ChannelRange as ChannelRange
from quantdbg.pipeline.records import RepairRecord as RepairRecord
from quantdbg.pipeline.records import SmoothingStep as SmoothingStep
from quantdbg.pipeline.records import TensorChoice as TensorChoice
from quantdbg.pipeline.repairs import REPAIR_PASSES as REPAIR_PASSES
from quantdbg.pipeline.repairs import BiasCorrectionRepair as BiasCorrectionRepair
from quantdbg.pipeline.repairs import CalibratorRepair as CalibratorRepair
from quantdbg.pipeline.repairs import EqualizeRepair as EqualizeRepair
from quantdbg.pipeline.repairs import Proposal as Proposal
from quantdbg.pipeline.repairs import RepairPass as RepairPass
from quantdbg.pipeline.repairs import SmoothQuantRepair as SmoothQuantRepair
from quantdbg.pipeline.repairs import with_per_tensor as with_per_tensor
from quantdbg.pipeline.result import AutoResult as AutoResult

__all__ = _public_names(globals())
