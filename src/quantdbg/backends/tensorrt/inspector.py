"""The engine inspector's JSON -> one :class:`LayerPrecision` per engine layer (plain Python).

TensorRT's ``IEngineInspector`` describes each layer of a built engine: its kernel, its tactic, the
format and element type of each input and output, and (with detailed profiling verbosity) the ONNX
nodes it was made from. This module reads that document; it needs no TensorRT.
"""
from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from quantdbg import _json
from quantdbg._json import Serializable
from quantdbg.errors import BackendError, FormatError

# Words TensorRT uses for element types in "Format/Datatype" strings (e.g. "Thirty-two wide channel
# vectorized row major Int8 format", "Row major linear FP32", "Half") and in TensorRT 11's separate
# "DataType" field ("Float", "Int8"). Matched word by word, so "BFloat16" never reads as "Float".
_TYPE_WORDS = {
    "bfloat16": "BF16", "bf16": "BF16", "half": "FP16", "fp16": "FP16", "float": "FP32", "fp32": "FP32",
    "double": "FP64", "int8": "INT8", "uint8": "UINT8", "int32": "INT32", "int64": "INT64",
    "bool": "BOOL", "fp8": "FP8", "int4": "INT4", "fp4": "FP4",
}
UNKNOWN = "unknown"
"""Precision reported when the inspector gives no type (names-only verbosity, dynamic shapes)."""

_ONNX_LAYER = re.compile(r"\[ONNX Layer: (.*?)\](?=[\x1e\x1f]|\[ONNX Layer: |$)", re.DOTALL)


@dataclass(frozen=True)
class LayerPrecision(Serializable):
    """One engine layer as the engine inspector reports it.

    Attributes:
        name: TensorRT layer name (fused layers join their members with `` + ``).
        layer_type: Kernel family, e.g. ``CaskConvolution``, ``Reformat``, ``kgen``.
        precision: Element type the layer reads (``INT8``, ``FP16``, ``FP32``, ...; ``unknown``),
            taken from its first input as trt-engine-explorer does.
        input_formats: Format/type description of each input.
        output_formats: Format/type description of each output.
        tactic: Kernel name (``TacticName``), else ``TacticValue``, else empty.
        onnx_nodes: ONNX node names from the layer's ``[ONNX Layer: ...]`` metadata.
    """

    name: str
    layer_type: str
    precision: str
    input_formats: tuple[str, ...] = ()
    output_formats: tuple[str, ...] = ()
    tactic: str = ""
    onnx_nodes: tuple[str, ...] = ()


def type_of_format(description: str) -> str:
    """Returns the element type named in an inspector format string, or ``"unknown"``.

    Args:
        description: E.g. ``"Channel major INT8 format where channel % 16 == 0"`` or ``"Half"``.

    Returns:
        ``INT8``, ``FP16``, ``FP32``, ``BF16``, ... or ``unknown``.
    """
    for word in re.split(r"[^0-9A-Za-z]+", description):
        found = _TYPE_WORDS.get(word.lower())
        if found:
            return found
    return UNKNOWN


def _tensor_format(tensor: Any) -> str:
    if not isinstance(tensor, Mapping):
        return str(tensor)
    # TensorRT 10: one "Format/Datatype" string; TensorRT 11 splits it into "Format" and "DataType".
    if "Format/Datatype" in tensor:
        return str(tensor["Format/Datatype"])
    parts = [str(tensor[key]) for key in ("DataType", "Format") if key in tensor]
    return " / ".join(parts)


def _tensors(entry: Mapping[str, Any], field: str) -> list[Any]:
    found = entry.get(field, [])
    if not isinstance(found, list):
        raise BackendError(f"Engine inspector layer {str(entry['Name'])!r}: field {field!r} is a "
                           f"{type(found).__name__}, expected a list of tensors.")
    return found


def _layer(entry: Any) -> LayerPrecision:
    if isinstance(entry, str):  # ProfilingVerbosity.LAYER_NAMES_ONLY: names and nothing else
        return LayerPrecision(entry, UNKNOWN, UNKNOWN)
    if not isinstance(entry, Mapping) or "Name" not in entry:
        raise BackendError(f"Engine inspector layer entry is not an object with a 'Name': {entry!r:.200}")
    inputs = tuple(_tensor_format(t) for t in _tensors(entry, "Inputs"))
    outputs = tuple(_tensor_format(t) for t in _tensors(entry, "Outputs"))
    typed = [type_of_format(f) for f in inputs + outputs]
    precision = next((t for t in typed if t != UNKNOWN), UNKNOWN)
    tactic = str(entry.get("TacticName") or entry.get("TacticValue") or "")
    nodes = tuple(m.strip() for m in _ONNX_LAYER.findall(str(entry.get("Metadata", ""))))
    return LayerPrecision(str(entry["Name"]), str(entry.get("LayerType", UNKNOWN)), precision,
                          inputs, outputs, tactic, nodes)


def parse_engine_info(text: str) -> tuple[LayerPrecision, ...]:
    """Turns ``EngineInspector.get_engine_information(LayerInformationFormat.JSON)`` into layers.

    Accepts the whole-engine document (``{"Layers": [...], ...}``), a single layer object (from
    ``get_layer_information``) or a bare list of layers, in the TensorRT 10 schema (one
    ``Format/Datatype`` string per tensor) and the TensorRT 11 schema (``DataType`` and ``Format``).

    Args:
        text: The inspector's JSON output.

    Returns:
        One :class:`LayerPrecision` per layer, in engine order.

    Raises:
        BackendError: The text is not JSON or not shaped like inspector output.
    """
    try:
        doc = _json.parse(text, "Engine inspector output")
    except FormatError as err:  # bad syntax, or nested absurdly deep
        raise BackendError(f"{err} Ask for LayerInformationFormat.JSON.") from None
    if isinstance(doc, Mapping) and "Layers" in doc:
        entries = doc["Layers"]
    elif isinstance(doc, Mapping):
        entries = [doc]
    else:
        entries = doc
    if not isinstance(entries, list):
        raise BackendError(f"Engine inspector 'Layers' is a {type(entries).__name__}, expected a list.")
    return tuple(_layer(entry) for entry in entries)


def precision_counts(layers: Sequence[LayerPrecision]) -> dict[str, int]:
    """Counts layers per precision, most common first (ties by name), for summaries."""
    counts: dict[str, int] = {}
    for layer in layers:
        counts[layer.precision] = counts.get(layer.precision, 0) + 1
    return dict(sorted(counts.items(), key=lambda item: (-item[1], item[0])))
