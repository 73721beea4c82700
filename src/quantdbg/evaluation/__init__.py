"""Evaluation: how a variant's outputs compare with FP32 (output metrics) and what the user's task
says of it (task metrics: accuracy, a callable, an external command)."""
from quantdbg.evaluation import travel as _travel  # noqa: F401  (registers how commands travel)
from quantdbg.evaluation.metrics import Comparison, OutputMetrics, compare_arrays, compare_outputs
from quantdbg.evaluation.task import (
    Accuracy,
    CommandMetric,
    ModelFunction,
    OutputFunction,
    OutputMetric,
    TaskMetric,
    Top1Agreement,
)

__all__ = [
    "Accuracy", "CommandMetric", "Comparison", "ModelFunction", "OutputFunction", "OutputMetric",
    "OutputMetrics", "TaskMetric", "Top1Agreement", "compare_arrays", "compare_outputs",
]
