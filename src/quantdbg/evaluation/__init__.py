"""Evaluation: how a variant's outputs compare with FP32 (output metrics) and what the user's task
says of it (task metrics: accuracy, a callable, an external command)."""
from quantdbg._exports import public_names as _public_names
from quantdbg.evaluation import travel as _travel  # noqa: F401  (registers how commands travel)
from quantdbg.evaluation.metrics import METRIC_NAMES as METRIC_NAMES
from quantdbg.evaluation.metrics import Comparison as Comparison
from quantdbg.evaluation.metrics import MetricAccumulator as MetricAccumulator
from quantdbg.evaluation.metrics import MetricName as MetricName
from quantdbg.evaluation.metrics import OutputMetrics as OutputMetrics
from quantdbg.evaluation.metrics import compare_arrays as compare_arrays
from quantdbg.evaluation.metrics import compare_outputs as compare_outputs
from quantdbg.evaluation.metrics import metrics_from_sums as metrics_from_sums
from quantdbg.evaluation.task import Accuracy as Accuracy
from quantdbg.evaluation.task import CommandMetric as CommandMetric
from quantdbg.evaluation.task import ModelFunction as ModelFunction
from quantdbg.evaluation.task import OutputFunction as OutputFunction
from quantdbg.evaluation.task import OutputMetric as OutputMetric
from quantdbg.evaluation.task import TaskMetric as TaskMetric
from quantdbg.evaluation.task import Top1Agreement as Top1Agreement
from quantdbg.evaluation.task import as_task_metric as as_task_metric
from quantdbg.evaluation.task import concat_batches as concat_batches
from quantdbg.evaluation.task import parse_metric_line as parse_metric_line

__all__ = _public_names(globals())
