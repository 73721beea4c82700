"""Loading and validating ONNX models: every quantdbg entry point passes its model through here.

The checks (checker, shape inference, opset, already-quantized input, external data) happen once,
and the caller's model is never modified: a ModelProto argument is copied, a file is only read. An
FP32 model's weights that are not plain initializers are folded into initializers on that copy
(:mod:`quantdbg.model.weights`), so every later stage finds each weight where it looks for one.
"""
from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import onnx
from google.protobuf.message import DecodeError
from onnx import shape_inference, version_converter

from quantdbg.errors import ModelError, QuantDbgError
from quantdbg.model.external import (  # noqa: F401 (re-exported)
    check_data_files,
    data_files,
    fits_in_protobuf,
    inline_small,
    mark_lazy,
)
from quantdbg.model.names import name_nodes
from quantdbg.model.staging import check_model
from quantdbg.model.weights import FoldedWeight, fold_weights, summarize_folded

logger = logging.getLogger(__name__)

MIN_OPSET = 13
"""Per-channel DequantizeLinear (``axis``) needs opset 13."""

QUANTIZED_OP_TYPES = frozenset({
    "QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "QLinearConv", "QLinearMatMul",
    "QLinearAdd", "QLinearMul", "QLinearGlobalAveragePool", "QLinearConcat", "QLinearSigmoid",
    "QLinearLeakyRelu", "QLinearAveragePool", "QLinearSoftmax", "ConvInteger", "MatMulInteger",
    "QGemm", "QAttention", "DynamicQuantizeMatMul",
})


@dataclass(frozen=True, eq=False)
class LoadedModel:
    """A model that passed :func:`load_model`'s checks; quantdbg functions given one skip them.

    Checker and shape inference take seconds on large models, so a pipeline loads once
    (:func:`as_loaded`) and hands the result on.

    Attributes:
        proto: The checked model (opset >= 13, shapes inferred, every node named, every weight of
            an FP32 model an initializer). Treat it as read-only: every quantdbg function copies
            before editing.
        quantized: It was loaded with ``allow_quantized=True`` (it may hold Q/DQ or QLinear ops).
        folded: The weights loading found outside plain initializers (Constant nodes, chains such
            as Transpose or Cast of an initializer, initializers listed as graph inputs) and
            folded into initializers, in graph order; empty for a clean export or a Q/DQ model.
    """

    proto: onnx.ModelProto
    quantized: bool = False
    folded: tuple[FoldedWeight, ...] = ()


ModelSource = str | os.PathLike | onnx.ModelProto | LoadedModel
"""A path to a ``.onnx`` file, a ModelProto (copied, never modified), or an already loaded model."""


def load_model(source: ModelSource, *, allow_quantized: bool = False) -> onnx.ModelProto:
    """Loads, checks and normalises an FP32 ONNX model without touching the source.

    Args:
        source: A path to a ``.onnx`` file (external data beside it stays
            there, read on demand: :mod:`quantdbg.model.external`), a ModelProto
            (copied, never modified), or a :class:`LoadedModel` (returned as it is, not re-checked).
        allow_quantized: Accept a model that already holds Q/DQ or QLinear ops (for analysing
            models quantized elsewhere).

    Returns:
        A new ModelProto at opset >= 13 with inferred shapes, weights in memory or in
        their data file (read on demand), every node
        named (:func:`~quantdbg.model.names.name_nodes`) and, unless it holds Q/DQ or QLinear ops,
        every weight folded into an initializer (see :attr:`LoadedModel.folded`).

    Raises:
        ModelError: The file is missing or unreadable, external data points outside the model's
            folder, the checker or shape inference fails, the opset cannot be converted, the
            model is already quantized and ``allow_quantized`` is False, or a weight computed from
            constants cannot be evaluated.
    """
    return as_loaded(source, allow_quantized=allow_quantized).proto


def as_loaded(source: ModelSource, *, allow_quantized: bool = False) -> LoadedModel:
    """Loads and checks ``source`` once (see :func:`load_model`); a LoadedModel is returned as it is.

    Raises:
        ModelError: As :func:`load_model`.
    """
    if isinstance(source, LoadedModel):
        if allow_quantized or not source.quantized:
            return source
        _refuse_quantized(source.proto)
        return LoadedModel(source.proto, False, source.folded)
    with _as_model_error(source):
        model = _infer_shapes(_checked(_convert_opset(_known_types(_utf8_dims(_read(source))))))
        name_nodes(model)
        if quantized_nodes(model):
            if not allow_quantized:
                _refuse_quantized(model)
            return LoadedModel(model, True)
        model, folded = fold_weights(model)
    if folded:
        logger.info("%s (on the loaded copy; the model itself is unchanged).", summarize_folded(folded))
    return LoadedModel(model, allow_quantized, folded)


# What onnx and protobuf raise on a malformed file besides their documented errors: a bad enum
# value (KeyError), a string that is not UTF-8, a NUL or URL in an external-data location, a folder
# where a file belongs.
_LOAD_ERRORS = (ValueError, KeyError, TypeError, IndexError, UnicodeError, OSError, RuntimeError,
                onnx.checker.ValidationError, DecodeError)


@contextlib.contextmanager
def _as_model_error(source: ModelSource) -> Iterator[None]:
    """Turns every exception onnx or protobuf raises while loading into one ModelError naming the file."""
    try:
        yield
    except QuantDbgError:
        raise
    except _LOAD_ERRORS as err:
        what = "the model" if isinstance(source, onnx.ModelProto) else repr(str(source))
        detail = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ModelError(f"Cannot load {what}: {detail} ({type(err).__name__}). Re-export the model, "
                         "or repair the file.") from err


def _known_types(model: onnx.ModelProto) -> onnx.ModelProto:
    """Refuses element types onnx does not define (later stages map each type to a NumPy dtype)."""
    known = set(onnx.TensorProto.DataType.values())
    graph = model.graph
    for tensor in graph.initializer:
        if tensor.data_type not in known:
            raise ModelError(f"Initializer {tensor.name!r} has data_type {tensor.data_type}, which ONNX does "
                             "not define; re-export the model.")
    for info in (*graph.input, *graph.output, *graph.value_info):
        if info.type.HasField("tensor_type") and info.type.tensor_type.elem_type not in known:
            raise ModelError(f"Tensor {info.name!r} has elem_type {info.type.tensor_type.elem_type}, which "
                             "ONNX does not define; re-export the model.")
    return model


def _utf8_dims(model: onnx.ModelProto) -> onnx.ModelProto:
    """Refuses dimension names that are not UTF-8 (protobuf hands them over as bytes, which every
    later stage would choke on)."""
    for graph in _graphs(model.graph):
        for kind, infos in (("input", graph.input), ("output", graph.output), ("value", graph.value_info)):
            for info in infos:
                dims = info.type.tensor_type.shape.dim if info.type.HasField("tensor_type") else ()
                bad = next((d.dim_param for d in dims if isinstance(d.dim_param, bytes)), None)
                if bad is not None:
                    raise ModelError(f"Graph {kind} {info.name!r} names a dimension with bytes that are not "
                                     f"UTF-8 ({bad!r}); ONNX names are UTF-8 text. Rename the dimension (or "
                                     "re-export the model).")
    return model


def _graphs(graph: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    """``graph`` and every subgraph of its nodes (If/Loop/Scan bodies), depth first."""
    yield graph
    for node in graph.node:
        for attr in node.attribute:
            for sub in ([attr.g] if attr.type == onnx.AttributeProto.GRAPH else attr.graphs):
                yield from _graphs(sub)


def _refuse_quantized(model: onnx.ModelProto) -> None:
    found = quantized_nodes(model)
    if found:
        raise ModelError(
            f"The model is already quantized: {len(found)} node(s) such as {found[0]!r} "
            f"({_op_of(model, found[0])}) hold Q/DQ or QLinear ops. Pass the FP32 original; to analyze "
            "this model as it is, give the FP32 original alongside it (`quantdbg analyze` / `fallback` "
            "MODEL --fp32 FP32.onnx; in Python, records_from_model)."
        )


def _read(source: str | os.PathLike | onnx.ModelProto) -> onnx.ModelProto:
    if isinstance(source, onnx.ModelProto):
        copy = onnx.ModelProto()
        copy.CopyFrom(source)
        return copy
    path = Path(source)
    if not path.is_file():
        raise ModelError(f"Model file {str(path)!r} does not exist or is not a file.")
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as err:  # protobuf raises several unrelated types
        raise ModelError(f"Cannot parse {str(path)!r} as an ONNX model: {err}") from err
    _check_external_locations(model, path.parent)
    mark_lazy(model, path.parent)  # weights stay in their data file until a stage needs them
    try:
        check_data_files(model)
    except (OSError, ValueError) as err:
        raise ModelError(f"Cannot load the external weights of {str(path)!r}: {err}. Put the data file "
                         "beside the model as it was saved, or re-export the model.") from err
    inline_small(model)  # shape inference reads small constants (shapes, axes); large weights stay lazy
    return model


def data_files_of(path: str | os.PathLike) -> tuple[Path, ...]:
    """The external data files the model file ``path`` names, found from its graph alone (no weight
    is read, none need exist): the files a command reading the model must never write.

    Returns:
        Their paths (the model's folder joined with each ``location``), sorted, each once; empty
        when ``path`` is not a readable ONNX file (loading it reports why).
    """
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception:  # protobuf raises several unrelated types; loading the model names the problem
        return ()
    mark_lazy(model, Path(path).parent)
    return data_files(model)


def _check_external_locations(model: onnx.ModelProto, base: Path) -> None:
    root = base.resolve()
    for tensor in onnx.external_data_helper._get_all_tensors(model):
        if not onnx.external_data_helper.uses_external_data(tensor):
            continue
        info = {entry.key: entry.value for entry in tensor.external_data}
        location = info.get("location", "")
        target = (root / location).resolve()
        if Path(location).is_absolute() or root not in target.parents:
            raise ModelError(
                f"Initializer {tensor.name!r} points to external data {location!r}, outside the "
                f"model's folder {str(root)!r}. Refusing to read it; move the data file beside the model."
            )


def opset_of(model: onnx.ModelProto) -> int:
    """Returns the default-domain opset version of ``model``."""
    for entry in model.opset_import:
        if entry.domain in ("", "ai.onnx"):
            return int(entry.version)
    raise ModelError("The model imports no default-domain ('ai.onnx') opset; cannot quantize it.")


def _convert_opset(model: onnx.ModelProto) -> onnx.ModelProto:
    version = opset_of(model)
    if version >= MIN_OPSET:
        return model
    try:
        converted = version_converter.convert_version(model, MIN_OPSET)
    except Exception as err:  # the converter raises bare RuntimeError / C++ errors
        raise ModelError(
            f"The model uses opset {version}; per-channel DequantizeLinear needs opset >= {MIN_OPSET} "
            f"and onnx's version converter failed: {err}. Re-export the model at opset >= {MIN_OPSET}."
        ) from err
    return converted


def _checked(model: onnx.ModelProto) -> onnx.ModelProto:
    try:
        check_model(model)  # by path when the weights are external or past 2 GB
    except onnx.checker.ValidationError as err:
        raise ModelError(f"The ONNX checker rejected the model: {err}") from err
    return model


def _infer_shapes(model: onnx.ModelProto) -> onnx.ModelProto:
    if not fits_in_protobuf(model):
        return model  # shape inference on protos this large needs the file path; ORT infers at run time
    try:
        return shape_inference.infer_shapes(model, strict_mode=True, data_prop=True)
    except Exception as err:  # InferenceError and C++ errors
        raise ModelError(f"ONNX shape inference failed: {err}. Fix the model's shapes or types.") from err


def quantized_nodes(model: onnx.ModelProto) -> list[str]:
    """Returns the names of nodes whose op type means the model is already quantized."""
    return [node.name or f"<unnamed {node.op_type} #{i}>" for i, node in enumerate(model.graph.node)
            if node.op_type in QUANTIZED_OP_TYPES]


def _op_of(model: onnx.ModelProto, name: str) -> str:
    for i, node in enumerate(model.graph.node):
        if (node.name or f"<unnamed {node.op_type} #{i}>") == name:
            return node.op_type
    return "?"
