"""The entry points: :func:`smooth` (measure, then rewrite), :func:`smoothing_targets` (what to
measure) and :func:`apply_smoothing` (rewrite with given ranges)."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import onnx

from quantdbg.calibration.smoothing.config import DEFAULT_SMOOTHING, SmoothingConfig
from quantdbg.calibration.smoothing.measure import collect_channel_absmax
from quantdbg.calibration.smoothing.migrate import absmax_for, migrate
from quantdbg.calibration.smoothing.plan import plan_groups
from quantdbg.calibration.smoothing.result import SmoothingResult
from quantdbg.data import DataSource, as_model_data
from quantdbg.model.external import fits_in_protobuf
from quantdbg.model.graph import to_graph, to_model
from quantdbg.model.load import ModelSource, as_loaded
from quantdbg.model.names import UniqueNames
from quantdbg.model.staging import check_model


def smooth(model: ModelSource, data: DataSource, config: SmoothingConfig = DEFAULT_SMOOTHING, *,
           batch_size: int | None = None, progress: bool = False,
           session_options: Any = None) -> SmoothingResult:
    """Migrates activation outliers into the weights of MatMul/Gemm nodes.

    One streamed ONNX Runtime pass measures each smoothed activation's per-channel max |x|
    (nothing per sample is kept), then :func:`apply_smoothing` rewrites a copy of the model.

    Args:
        model: FP32 model path or ModelProto (never modified).
        data: Calibration data (``.npz`` path, arrays, or feeds; see :func:`quantdbg.data.as_data`).
        config: Strength, node selection and folding.
        batch_size: Samples per feed for ``.npz`` paths and arrays (default 32); the result
            does not depend on it.
        progress: Show a progress bar.
        session_options: ``onnxruntime.SessionOptions`` for the measuring session.

    Returns:
        The smoothed FP32 model and one :class:`Migration` per smoothed activation tensor.

    Raises:
        ModelError: The model is invalid or already quantized, or a ``nodes``/``exclude`` glob
            matches no node.
        DataError: The data is empty or does not match the model's inputs.
        BackendError: ONNX Runtime failed.
    """
    loaded = as_loaded(model)
    feeds = as_model_data(data, loaded.proto, batch_size)
    measured = collect_channel_absmax(loaded, feeds, smoothing_targets(loaded, config),
                                      max_batches=config.max_batches, progress=progress,
                                      session_options=session_options)
    result = apply_smoothing(loaded, measured.absmax, config)
    return SmoothingResult(result.model, result.migrations, result.skipped, config,
                           measured.n_batches, measured.n_samples)


def smoothing_targets(model: ModelSource, config: SmoothingConfig = DEFAULT_SMOOTHING) -> tuple[str, ...]:
    """The activation tensors whose per-channel ranges :func:`apply_smoothing` needs, in graph order.

    Args:
        model: FP32 model path or ModelProto (never modified).
        config: Node selection.

    Returns:
        One tensor per group of selected nodes reading it.

    Raises:
        ModelError: The model is invalid or a ``nodes``/``exclude`` glob matches no node.
    """
    groups, _ = plan_groups(to_graph(as_loaded(model).proto), config)
    return tuple(g.tensor.name for g in groups)


def apply_smoothing(model: ModelSource, act_absmax: Mapping[str, np.ndarray],
                    config: SmoothingConfig = DEFAULT_SMOOTHING) -> SmoothingResult:
    """Rewrites a copy of ``model`` with given per-channel activation ranges.

    Args:
        model: FP32 model path or ModelProto (never modified).
        act_absmax: Activation tensor name -> per-channel max |x| (last axis), for every
            activation read by a selected node (e.g. from :func:`collect_channel_absmax`).
        config: Strength, node selection and folding.

    Returns:
        The smoothed model and its migrations (``n_batches`` 0: nothing was measured here).

    Raises:
        ModelError: The model is invalid, a glob matches no node, or a vector's length differs
            from the weight's input channels.
        DataError: A selected activation has no entry in ``act_absmax``.
    """
    loaded = as_loaded(model).proto
    graph = to_graph(loaded)
    groups, skipped = plan_groups(graph, config)
    names = UniqueNames.of_graph(graph)
    outputs = {t.name for t in graph.outputs}
    migrations = []
    for group in groups:
        absmax = absmax_for(group, act_absmax)
        migrations.append(migrate(graph, group, absmax, config, outputs, names))
    return SmoothingResult(_checked(to_model(graph, like=loaded)), tuple(migrations), tuple(skipped), config)


def _checked(smoothed: onnx.ModelProto) -> onnx.ModelProto:
    """The smoothed model, checked and with shapes inferred (protobuf cannot do either past 2 GB in
    memory; ONNX Runtime infers shapes later)."""
    if fits_in_protobuf(smoothed):
        try:
            check_model(smoothed)
            smoothed = onnx.shape_inference.infer_shapes(smoothed)
        except Exception as err:  # a bug in quantdbg, not a user error
            raise AssertionError(f"smoothing produced an invalid ONNX model: {err}") from err
    return smoothed
