"""Evaluation: how a variant's outputs compare with FP32 (output metrics) and what the user's task
says of it (task metrics: accuracy, a callable, an external command)."""
from quantdbg.evaluation.metrics import (
    METRIC_NAMES,
    Comparison,
    MetricAccumulator,
    MetricName,
    OutputMetrics,
    compare_arrays,
    compare_outputs,
    metrics_from_sums,
)
from quantdbg.evaluation.task import (
    Accuracy,
    CommandMetric,
    ModelFunction,
    OutputFunction,
    OutputMetric,
    TaskMetric,
    Top1Agreement,
    as_task_metric,
    concat_batches,
    parse_metric_line,
)

__all__ = ["METRIC_NAMES", "Accuracy", "CommandMetric", "Comparison", "MetricAccumulator", "MetricName",
           "ModelFunction", "OutputFunction", "OutputMetric", "OutputMetrics", "TaskMetric", "Top1Agreement",
           "as_task_metric", "compare_arrays", "compare_outputs", "concat_batches",
           "metrics_from_sums", "parse_metric_line"]
