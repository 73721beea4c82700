"""Q/DQ placement, insertion and removal (TensorRT explicit quantization), with provenance.

OWNER: qdq helper. QdqRecord/QdqPlan/QuantizedModel are shared by every stage; keep their fields
(adding fields with defaults is fine).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import onnx


@dataclass(frozen=True)
class QuantTarget:
    """One input of one node that will get a Q/DQ pair.

    Attributes:
        node: Consumer node name (the "layer").
        op_type: The consumer's op type.
        input_index: Which input of the node.
        tensor: ONNX value name of that input in the FP32 model.
        kind: ``"weight"`` (an initializer, per-channel) or ``"activation"`` (per tensor).
    """

    node: str
    op_type: str
    input_index: int
    tensor: str
    kind: Literal["weight", "activation"]


@dataclass(frozen=True)
class QdqPlan:
    """Where Q/DQ pairs go, decided before calibration so exactly these tensors are calibrated.

    Attributes:
        targets: Every (node, input) to quantize, in graph order.
        shared_scale_groups: Groups of activation tensors that must share one scale (Concat inputs).
    """

    targets: tuple[QuantTarget, ...]
    shared_scale_groups: tuple[tuple[str, ...], ...] = ()

    @property
    def activation_tensors(self) -> tuple[str, ...]:
        """Distinct activation tensors to calibrate, in graph order."""
        return tuple(dict.fromkeys(t.tensor for t in self.targets if t.kind == "activation"))

    @property
    def layers(self) -> tuple[str, ...]:
        """Distinct quantized node names, in graph order."""
        return tuple(dict.fromkeys(t.node for t in self.targets))


@dataclass(frozen=True)
class QdqRecord:
    """Provenance of one inserted Q/DQ pair: later stages never parse names to recover it.

    Attributes:
        node: Consumer node name.
        op_type: The consumer's op type.
        input_index: Which input of ``node`` the pair feeds.
        tensor: The FP32 tensor that was quantized.
        kind: ``"weight"`` or ``"activation"``.
        quantize_node: Name of the inserted QuantizeLinear (None when the weight is stored as
            INT8 and only dequantized).
        dequantize_node: Name of the inserted DequantizeLinear.
        scale: The scale(s), one per channel for per-channel weights.
        axis: Channel axis of a per-channel scale, else None.
        calibrator: Calibrator that chose the range (``"absmax"`` for weights).
    """

    node: str
    op_type: str
    input_index: int
    tensor: str
    kind: Literal["weight", "activation"]
    quantize_node: str | None
    dequantize_node: str
    scale: tuple[float, ...]
    axis: int | None
    calibrator: str


@dataclass(frozen=True)
class QuantizedModel:
    """A Q/DQ model and the record of every pair in it.

    Attributes:
        model: The Q/DQ ONNX model (passes onnx.checker, runs in ONNX Runtime).
        records: One record per inserted pair.
    """

    model: onnx.ModelProto
    records: tuple[QdqRecord, ...]

    @property
    def layers(self) -> tuple[str, ...]:
        """Distinct quantized node names, in graph order."""
        return tuple(dict.fromkeys(r.node for r in self.records))
