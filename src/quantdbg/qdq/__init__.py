"""The Q/DQ model: insertion from a plan and a calibration, removal (fallback), records of foreign
models, and the TensorRT calibration cache / JSON scales written from it."""
from quantdbg.qdq.cache import (
    CalibrationScales,
    read_scales_json,
    read_trt_cache,
    write_scales_json,
    write_trt_cache,
)
from quantdbg.qdq.foreign import records_from_model
from quantdbg.qdq.insert import insert_qdq
from quantdbg.qdq.quantizer import quantize
from quantdbg.qdq.records import QdqRecord, QuantizedModel
from quantdbg.qdq.remove import remove_qdq

__all__ = [
    "CalibrationScales", "QdqRecord", "QuantizedModel", "insert_qdq", "quantize", "read_scales_json",
    "read_trt_cache", "records_from_model", "remove_qdq", "write_scales_json", "write_trt_cache",
]
