"""Sensitivity: which quantized layers hurt, ranked by node name, with the evidence of why.

``config`` (modes, SensitivityConfig) -> ``evaluator`` (variants of the Q/DQ model on one session of
the ``graphs``' switchable graph; ``journaled`` keeps its evaluations in the run's journal) ->
``modes`` (registry: ``local``, ``cumulative``, ``sweep`` for isolated / leave-one-out, summed by
``reductions``) -> ``evidence`` -> ``output_space`` (each layer alone in INT8, scored on the model's
outputs; ``ranks`` fuses that ranking with the mode's and measures their agreement) ->
``measurement`` -> ``report`` (SensitivityReport); ``analyze`` runs them in that order, and
``suggest`` turns a report's evidence into per-tensor calibrator choices.
"""
from quantdbg._exports import public_names as _public_names
from quantdbg.sensitivity.analyze import analyze_sensitivity as analyze_sensitivity
from quantdbg.sensitivity.analyze import analyze_variants as analyze_variants
from quantdbg.sensitivity.analyze import finished_report as finished_report
from quantdbg.sensitivity.config import EVIDENCE_BATCHES as EVIDENCE_BATCHES
from quantdbg.sensitivity.config import MODES as MODES
from quantdbg.sensitivity.config import OUTPUT_SAMPLES as OUTPUT_SAMPLES
from quantdbg.sensitivity.config import OUTPUT_SPACE_MODES as OUTPUT_SPACE_MODES
from quantdbg.sensitivity.config import Mode as Mode
from quantdbg.sensitivity.config import SensitivityConfig as SensitivityConfig
from quantdbg.sensitivity.evaluator import VariantEvaluator as VariantEvaluator
from quantdbg.sensitivity.evaluator import VariantResult as VariantResult
from quantdbg.sensitivity.evaluator import default_runner_factory as default_runner_factory
from quantdbg.sensitivity.evidence import LayerEvidence as LayerEvidence
from quantdbg.sensitivity.journaled import JournaledEvaluator as JournaledEvaluator
from quantdbg.sensitivity.journaled import JournaledMetric as JournaledMetric
from quantdbg.sensitivity.journaled import model_key as model_key
from quantdbg.sensitivity.modes import MODE_FUNCTIONS as MODE_FUNCTIONS
from quantdbg.sensitivity.output_space import OutputSpace as OutputSpace
from quantdbg.sensitivity.output_space import measure_output_space as measure_output_space
from quantdbg.sensitivity.ranks import FUSION_K as FUSION_K
from quantdbg.sensitivity.ranks import TOP_K as TOP_K
from quantdbg.sensitivity.ranks import RankAgreement as RankAgreement
from quantdbg.sensitivity.ranks import fuse_rankings as fuse_rankings
from quantdbg.sensitivity.ranks import rank_agreement as rank_agreement
from quantdbg.sensitivity.ranks import rank_correlation as rank_correlation
from quantdbg.sensitivity.report import LayerSensitivity as LayerSensitivity
from quantdbg.sensitivity.report import QuantizedInput as QuantizedInput
from quantdbg.sensitivity.report import SensitivityReport as SensitivityReport
from quantdbg.sensitivity.report import TensorError as TensorError
from quantdbg.sensitivity.suggest import suggest_calibrators as suggest_calibrators

__all__ = _public_names(globals())
