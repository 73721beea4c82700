"""QdqRecord and QuantizedModel: what a record says, the records of a node, saving, the JSON form."""
from __future__ import annotations

import json

import models
import numpy as np
import onnx
import pytest

from quantdbg.calibration import CalibrationResult, TensorRange
from quantdbg.config import Precision, TensorKind
from quantdbg.errors import FormatError
from quantdbg.placement import plan_qdq
from quantdbg.qdq import QdqRecord, QuantizedModel, insert_qdq, remove_qdq


def _quantized() -> QuantizedModel:
    model = models.concat_convs()
    plan = plan_qdq(model)
    return insert_qdq(model, CalibrationResult({t: TensorRange(t, -1, 1, "entropy")
                                                for t in plan.activation_tensors}, {}), plan=plan)


def test_record_amax_is_127_times_each_scale():
    record = QdqRecord("conv", "Conv", 1, "w", "weight", "q", "dq", (0.5, 0.25), 0, "absmax", (0, 0))
    assert record.kind is TensorKind.WEIGHT  # a plain string becomes the enum
    assert record.amax == (63.5, 31.75)


def test_layers_and_records_of_follow_the_records():
    qm = _quantized()
    assert qm.layers == tuple(dict.fromkeys(r.node for r in qm.records))
    assert [(r.input_index, r.tensor) for r in qm.records_of("concat")] == [(0, "a"), (1, "b_scaled")]
    assert qm.records_of("no such node") == ()


def test_save_writes_the_qdq_model(tmp_path):
    qm = _quantized()
    path = qm.save(tmp_path / "int8.onnx")
    assert onnx.load(str(path)).SerializeToString() == qm.model.SerializeToString()


def test_records_json_form_and_round_trip():
    qm = remove_qdq(_quantized(), ["conv_out"], Precision.FP32)
    data = json.loads(json.dumps(qm.to_dict(), allow_nan=False))
    assert list(data) == ["records", "excluded", "excluded_precision"]  # never the model bytes
    assert (data["excluded"], data["excluded_precision"]) == (["conv_out"], "fp32")
    first = qm.records[0]
    assert data["records"][0] == {
        "node": first.node, "op_type": "Conv", "input_index": 0, "tensor": "x", "kind": "activation",
        "quantize_node": first.quantize_node, "dequantize_node": first.dequantize_node,
        "scale": [float(np.float32(1 / 127))], "axis": None, "calibrator": "entropy", "zero_point": [0]}
    again = QuantizedModel.from_dict(data, qm.model)
    assert again == qm and again.excluded_precision is Precision.FP32
    assert QdqRecord.from_dict(data["records"][1]) == qm.records[1]


def test_records_from_bad_json_name_the_field():
    qm = _quantized()
    data = json.loads(json.dumps(qm.to_dict()))
    data["records"][2]["scale"] = ["wide"]
    with pytest.raises(FormatError) as err:
        QuantizedModel.from_dict(data, qm.model, "records.json")
    assert str(err.value).startswith("records.json: not a valid QuantizedModel: field 'records[2].scale[0]': "
                                     "expected a number")
