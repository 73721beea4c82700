"""The one-call path: load, plan Q/DQ placement, calibrate, insert Q/DQ.

The pieces (:func:`quantdbg.qdq.plan_qdq`, :func:`quantdbg.calibrate.calibrate`,
:func:`quantdbg.qdq.insert_qdq`) stay public for notebooks that want to look between steps.
"""
from __future__ import annotations

import onnx

from quantdbg.calibrate import calibrate_loaded
from quantdbg.config import CalibConfig, QuantConfig
from quantdbg.data import ArrayData, CalibrationData, DataSource, as_data
from quantdbg.errors import DataError
from quantdbg.model import ModelSource, input_specs, load_model, name_nodes
from quantdbg.qdq import QuantizedModel, insert_qdq_loaded, plan_qdq

DEFAULT_BATCH_SIZE = 32
_DEFAULT_CALIB = CalibConfig()
_DEFAULT_QUANT = QuantConfig()


def quantize(model: ModelSource, data: DataSource, calib: CalibConfig = _DEFAULT_CALIB,
             quant: QuantConfig = _DEFAULT_QUANT, *, batch_size: int | None = None,
             progress: bool = False) -> QuantizedModel:
    """Quantizes an FP32 ONNX model to INT8 Q/DQ for TensorRT explicit quantization.

    Args:
        model: Path of an FP32 ``.onnx`` file or a ModelProto (never modified).
        data: Calibration data: an ``.npz`` path, a mapping input name -> array (samples on
            axis 0), or an iterable of feed dicts.
        calib: How activation ranges are chosen (calibrator per op type / tensor).
        quant: Where Q/DQ pairs go.
        batch_size: Samples per calibration batch for ``.npz`` paths and arrays (default 32).
            Scales do not depend on it; it only trades memory for speed.
        progress: Show a progress bar while calibrating.

    Returns:
        The Q/DQ model with a record per pair and its CalibrationResult attached
        (``result.calibration``); save it with ``result.save(path)``.

    Raises:
        ModelError: The model cannot be loaded, is already quantized, or an exclusion matches
            no node.
        DataError: The data is empty or does not match the model's inputs.
        ConfigError: A calibrator name or setting is invalid.
        NotCalibratedError: A planned activation received no range.
    """
    fp_model = name_nodes(load_model(model))
    feeds = _as_feeds(data, fp_model, batch_size)
    plan = plan_qdq(fp_model, quant)
    result = calibrate_loaded(fp_model, feeds, plan, calib, progress=progress)
    return insert_qdq_loaded(fp_model, result, quant, plan=plan)


def _as_feeds(data: DataSource, model: onnx.ModelProto, batch_size: int | None) -> CalibrationData:
    if batch_size is not None and batch_size < 1:
        raise DataError(f"batch_size must be >= 1, got {batch_size}.")
    feeds = as_data(data, batch_size or DEFAULT_BATCH_SIZE, inputs=list(input_specs(model)))
    if batch_size is not None and isinstance(feeds, ArrayData) and feeds.batch_size != batch_size:
        feeds = feeds.with_batch_size(batch_size)
    return feeds
