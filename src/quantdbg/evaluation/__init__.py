"""Evaluation: how a variant's outputs compare with FP32 (output metrics) and what the user's task
says of it (task metrics: accuracy, a callable, an external command)."""
from quantdbg._exports import public_names as _public_names
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

__all__ = _public_names(globals())
