"""The Q/DQ model: insertion from a plan and a calibration, removal (fallback), records of foreign
models, and the TensorRT calibration cache / JSON scales written from it."""
from quantdbg._exports import public_names as _public_names
from quantdbg.qdq.cache import CalibrationScales as CalibrationScales
from quantdbg.qdq.cache import read_scales_json as read_scales_json
from quantdbg.qdq.cache import read_trt_cache as read_trt_cache
from quantdbg.qdq.cache import write_scales_json as write_scales_json
from quantdbg.qdq.cache import write_trt_cache as write_trt_cache
from quantdbg.qdq.foreign import records_from_model as records_from_model
from quantdbg.qdq.insert import insert_qdq as insert_qdq
from quantdbg.qdq.quantizer import quantize as quantize
from quantdbg.qdq.records import QdqRecord as QdqRecord
from quantdbg.qdq.records import QuantizedModel as QuantizedModel
from quantdbg.qdq.remove import remove_qdq as remove_qdq

__all__ = _public_names(globals())
