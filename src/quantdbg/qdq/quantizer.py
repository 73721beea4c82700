"""The one-call path: load, plan Q/DQ placement, calibrate, insert Q/DQ.

The pieces (:func:`quantdbg.plan_qdq`, :func:`quantdbg.calibrate`, :func:`quantdbg.insert_qdq`)
stay public for notebooks that want to look between steps.
"""
from __future__ import annotations

from quantdbg.calibration import calibrate
from quantdbg.config import CalibConfig, QuantConfig
from quantdbg.data import DEFAULT_BATCH_SIZE as DEFAULT_BATCH_SIZE  # still importable from here
from quantdbg.data import DataSource, as_model_data
from quantdbg.model.load import ModelSource, as_loaded
from quantdbg.placement import plan_qdq
from quantdbg.qdq.insert import insert_qdq
from quantdbg.qdq.records import QuantizedModel

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
    fp_model = as_loaded(model)
    feeds = as_model_data(data, fp_model.proto, batch_size)
    plan = plan_qdq(fp_model, quant)
    result = calibrate(fp_model, feeds, calib, plan, progress=progress)
    return insert_qdq(fp_model, result, quant, plan=plan)

