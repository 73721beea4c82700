"""What a Q/DQ model is made of: one :class:`QdqRecord` per inserted pair, and the model with them.

Every inserted pair is one record, one pair per (node, input), so removing the pairs of one node
never changes another node; later stages never parse names to recover that link.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import onnx

from quantdbg import _display, _json
from quantdbg.config import Precision, TensorKind
from quantdbg.model import SaveConfig, save_model
from quantdbg.quant_math import QMAX

if TYPE_CHECKING:
    import os

    from quantdbg.calibration import CalibrationResult

WEIGHT_CALIBRATOR = "absmax"
EXTERNAL_CALIBRATOR = "external"
"""``QdqRecord.calibrator`` of pairs found in a model quantized elsewhere."""


@dataclass(frozen=True)
class QdqRecord(_json.Serializable):
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
        zero_point: The zero point(s); all zero for quantdbg's symmetric pairs, possibly not for
            models quantized elsewhere (e.g. ONNX Runtime's uint8 activations).
    """

    node: str
    op_type: str
    input_index: int
    tensor: str
    kind: TensorKind
    quantize_node: str | None
    dequantize_node: str
    scale: tuple[float, ...]
    axis: int | None
    calibrator: str
    zero_point: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", TensorKind(self.kind))  # also from JSON's plain strings

    @property
    def amax(self) -> tuple[float, ...]:
        """The clipping range(s) ``127 * scale`` of a symmetric INT8 pair."""
        return tuple(QMAX * s for s in self.scale)


@dataclass(frozen=True, repr=False)
class QuantizedModel(_display.Displayable):
    """A Q/DQ model and the record of every pair in it.

    Attributes:
        model: The Q/DQ ONNX model (passes onnx.checker, runs in ONNX Runtime).
        records: One record per inserted pair.
        calibration: The calibration behind the activation scales (None for models quantized
            elsewhere and read with :func:`records_from_model`).
        excluded: Nodes kept out of INT8: their Q/DQ pairs were removed (by
            :func:`quantdbg.qdq.remove_qdq`), in the order they were removed.
        excluded_precision: Precision the excluded nodes compute in (None when none is excluded).
    """

    model: onnx.ModelProto
    records: tuple[QdqRecord, ...]
    calibration: CalibrationResult | None = field(default=None, compare=False)
    excluded: tuple[str, ...] = ()
    excluded_precision: Precision | None = None

    @property
    def layers(self) -> tuple[str, ...]:
        """Distinct quantized node names, in graph order."""
        return tuple(dict.fromkeys(r.node for r in self.records))

    def records_of(self, node: str) -> tuple[QdqRecord, ...]:
        """The records of the pairs feeding ``node`` (empty when it is not quantized)."""
        return tuple(r for r in self.records if r.node == node)

    def save(self, path: str | os.PathLike, config: SaveConfig | None = None) -> Path:
        """Writes the Q/DQ model atomically (see :func:`quantdbg.model.save_model`).

        Args:
            path: Destination ``.onnx`` path; its folder must exist.
            config: When and where the weights go to a data file beside it (default: when the
                FP32 input kept them in one, or past :attr:`SaveConfig.threshold_bytes`).

        Returns:
            The destination path.

        Raises:
            ModelError: The destination folder does not exist.
        """
        return save_model(self.model, path, config)

    def to_dict(self) -> dict[str, Any]:
        """Returns the provenance (records and excluded nodes, not the model bytes) as JSON-ready data."""
        return _QuantizedModelProvenance(self.records, self.excluded, self.excluded_precision).to_dict()

    @classmethod
    def from_dict(cls, data: Any, model: onnx.ModelProto, source: str = "<data>") -> QuantizedModel:
        """Rebuilds a QuantizedModel from :meth:`to_dict` output and the model it describes.

        Raises:
            FormatError: ``data`` is not what :meth:`to_dict` writes (``source`` and the field named).
        """
        found = _QuantizedModelProvenance.from_dict(data, source)
        return cls(model, found.records, excluded=found.excluded, excluded_precision=found.excluded_precision)


@dataclass(frozen=True)
class _QuantizedModelProvenance(_json.Serializable):
    """What JSON holds of a :class:`QuantizedModel`: everything but the model and its calibration."""

    records: tuple[QdqRecord, ...]
    excluded: tuple[str, ...] = ()
    excluded_precision: Precision | None = None


_QuantizedModelProvenance.__name__ = "QuantizedModel"  # what its FormatErrors call it: the JSON form of one
