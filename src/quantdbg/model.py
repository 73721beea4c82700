"""Loading and validating ONNX models; the only ModelProto <-> gs.Graph boundary.

Every entry point of quantdbg passes its model through :func:`load_model`, so the checks
(checker, shape inference, opset, already-quantized input, external data) happen once, and the
caller's model is never modified: a ModelProto argument is copied, a file is only read.
"""
from __future__ import annotations

import fnmatch
import os
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import onnx_graphsurgeon as gs
from onnx import external_data_helper, helper, shape_inference, version_converter

from quantdbg._io import write_bytes_atomic
from quantdbg.errors import ModelError, unknown

MIN_OPSET = 13
"""Per-channel DequantizeLinear (``axis``) needs opset 13."""

QUANTIZED_OP_TYPES = frozenset({
    "QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "QLinearConv", "QLinearMatMul",
    "QLinearAdd", "QLinearMul", "QLinearGlobalAveragePool", "QLinearConcat", "QLinearSigmoid",
    "QLinearLeakyRelu", "QLinearAveragePool", "QLinearSoftmax", "ConvInteger", "MatMulInteger",
    "QGemm", "QAttention", "DynamicQuantizeMatMul",
})
_TWO_GB = 2**31 - 1


@dataclass(frozen=True, eq=False)
class LoadedModel:
    """A model that passed :func:`load_model`'s checks; quantdbg functions given one skip them.

    Checker and shape inference take seconds on large models, so a pipeline loads once
    (:func:`as_loaded`) and hands the result on.

    Attributes:
        proto: The checked model (opset >= 13, shapes inferred, every node named). Treat it as
            read-only: every quantdbg function copies before editing.
        quantized: It was loaded with ``allow_quantized=True`` (it may hold Q/DQ or QLinear ops).
    """

    proto: onnx.ModelProto
    quantized: bool = False


ModelSource = str | os.PathLike | onnx.ModelProto | LoadedModel
"""A path to a ``.onnx`` file, a ModelProto (copied, never modified), or an already loaded model."""


@dataclass(frozen=True)
class TensorSpec:
    """Name, element type and shape of a graph input or output.

    Attributes:
        name: ONNX value name.
        dtype: NumPy dtype of the elements.
        shape: One entry per axis: an int for a fixed dim, a str for a named dynamic dim, None
            for an unnamed dynamic dim.
    """

    name: str
    dtype: np.dtype
    shape: tuple[int | str | None, ...]


def load_model(source: ModelSource, *, allow_quantized: bool = False) -> onnx.ModelProto:
    """Loads, checks and normalises an FP32 ONNX model without touching the source.

    Args:
        source: A path to a ``.onnx`` file (external data beside it is loaded), a ModelProto
            (copied, never modified), or a :class:`LoadedModel` (returned as it is, not re-checked).
        allow_quantized: Accept a model that already holds Q/DQ or QLinear ops (for analysing
            models quantized elsewhere).

    Returns:
        A new ModelProto at opset >= 13 with inferred shapes, weights in memory and every node
        named (:func:`name_nodes`).

    Raises:
        ModelError: The file is missing or unreadable, external data points outside the model's
            folder, the checker or shape inference fails, the opset cannot be converted, or the
            model is already quantized and ``allow_quantized`` is False.
    """
    if isinstance(source, LoadedModel):
        model = source.proto
    else:
        model = _infer_shapes(_checked(_convert_opset(_read(source))))
        name_nodes(model)
    if not allow_quantized:
        found = quantized_nodes(model)
        if found:
            raise ModelError(
                f"The model is already quantized: {len(found)} node(s) such as {found[0]!r} "
                f"({_op_of(model, found[0])}) hold Q/DQ or QLinear ops. Pass the FP32 original, or "
                "use the analysis entry points that accept quantized models (allow_quantized=True)."
            )
    return model


def as_loaded(source: ModelSource, *, allow_quantized: bool = False) -> LoadedModel:
    """Loads and checks ``source`` once (see :func:`load_model`); a LoadedModel is returned as it is.

    Raises:
        ModelError: As :func:`load_model`.
    """
    if isinstance(source, LoadedModel) and (allow_quantized or not source.quantized):
        return source
    return LoadedModel(load_model(source, allow_quantized=allow_quantized), allow_quantized)


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
    try:
        onnx.external_data_helper.load_external_data_for_model(model, str(path.parent))
    except (OSError, ValueError) as err:
        raise ModelError(f"Cannot load the external weights of {str(path)!r}: {err}") from err
    return model


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


def fits_in_protobuf(model: onnx.ModelProto) -> bool:
    """True when ``model`` serialises to under 2 GB (the protobuf limit for in-memory checks).

    ``ByteSize()`` walks the whole message (about 0.3 s for a 90 MB model), so the weights'
    payload is summed first and the exact size is asked for only near the limit.
    """
    payload = sum(len(t.raw_data) + 4 * (len(t.float_data) + len(t.int32_data)) + 8 * len(t.int64_data)
                  for t in model.graph.initializer)
    if payload < _TWO_GB // 2:
        return True
    return model.ByteSize() < _TWO_GB


def _checked(model: onnx.ModelProto) -> onnx.ModelProto:
    try:
        if fits_in_protobuf(model):
            onnx.checker.check_model(model)
        else:
            with tempfile.TemporaryDirectory() as tmp:
                path = Path(tmp) / "model.onnx"
                copy = onnx.ModelProto()
                copy.CopyFrom(model)  # onnx.save rewrites the initializers it externalises
                onnx.save(copy, str(path), save_as_external_data=True, location="weights.bin")
                onnx.checker.check_model(str(path))
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


def input_specs(model: onnx.ModelProto) -> dict[str, TensorSpec]:
    """Returns the graph inputs that are not initializers, in graph order."""
    inits = {init.name for init in model.graph.initializer}
    return {vi.name: _spec(vi) for vi in model.graph.input if vi.name not in inits}


def output_specs(model: onnx.ModelProto) -> dict[str, TensorSpec]:
    """Returns the graph outputs in graph order."""
    return {vi.name: _spec(vi) for vi in model.graph.output}


def _spec(vi: onnx.ValueInfoProto) -> TensorSpec:
    ttype = vi.type.tensor_type
    dtype = np.dtype(helper.tensor_dtype_to_np_dtype(ttype.elem_type))
    dims: list[int | str | None] = []
    for dim in ttype.shape.dim:
        if dim.HasField("dim_value"):
            dims.append(int(dim.dim_value))
        elif dim.HasField("dim_param"):
            dims.append(dim.dim_param)
        else:
            dims.append(None)
    return TensorSpec(vi.name, dtype, tuple(dims))


def name_nodes(model: onnx.ModelProto) -> onnx.ModelProto:
    """Gives every unnamed node a unique name ``<op_type>_<index>`` in place and returns ``model``.

    Layers are identified by node name throughout quantdbg, so a model with unnamed or
    duplicate-named nodes gets deterministic names first.
    """
    nodes = model.graph.node
    for node, name in zip(nodes, node_names((n.name, n.op_type) for n in nodes), strict=True):
        node.name = name
    return model


def node_names(nodes: Iterable[tuple[str, str]]) -> list[str]:
    """The names :func:`name_nodes` gives ``(name, op_type)`` pairs in graph order.

    A node keeps its name unless it has none or repeats an earlier node's; then it is named
    ``<op_type>_<index>``.
    """
    seen: set[str] = set()
    names = []
    for i, (name, op) in enumerate(nodes):
        if not name or name in seen:
            name = f"{op}_{i}"
        seen.add(name)
        names.append(name)
    return names


def check_node_globs(owner: str, patterns: Iterable[str], names: Sequence[str]) -> None:
    """Checks that every node-name glob matches a node, so a typo is not silently ignored.

    Args:
        owner: The setting the globs come from, e.g. ``"QuantConfig.exclude"``.
        patterns: Node names or ``fnmatch`` globs.
        names: The model's node names.

    Raises:
        ModelError: A glob matches no node (close names are suggested).
    """
    for pattern in patterns:
        if not any(fnmatch.fnmatchcase(name, pattern) for name in names):
            err = unknown("node", pattern, names)
            raise ModelError(f"{owner} entry {pattern!r} matches no node. {err}")


class UniqueNames:
    """Fresh node/tensor names that collide with nothing in a model, deterministic for a given model.

    Calling it with a base name returns ``base`` when free, else the first free ``base_<n>``
    (n = 1, 2, ...), and reserves the name returned.

    Args:
        used: Names already taken.
    """

    def __init__(self, used: Iterable[str]) -> None:
        self.used = set(used)

    @classmethod
    def of_graph(cls, graph: gs.Graph) -> UniqueNames:
        """Reserves every node and tensor name of an onnx-graphsurgeon graph."""
        return cls({node.name for node in graph.nodes} | set(graph.tensors()))

    @classmethod
    def of_model(cls, model: onnx.ModelProto) -> UniqueNames:
        """Reserves every node, initializer, input, output, value_info and edge name of ``model``."""
        graph = model.graph
        used = {n.name for n in graph.node} | {i.name for i in graph.initializer}
        used |= {v.name for v in (*graph.input, *graph.output, *graph.value_info)}
        used |= {t for n in graph.node for t in (*n.input, *n.output)}
        return cls(used)

    def __call__(self, base: str) -> str:
        name, n = base, 0
        while name in self.used:
            n += 1
            name = f"{base}_{n}"
        self.used.add(name)
        return name


def constant_values(tensor: gs.Tensor) -> np.ndarray | None:
    """Values of an initializer or of a Constant node's output, else None."""
    if isinstance(tensor, gs.Constant):
        return np.asarray(tensor.values)
    producer = tensor.inputs[0] if len(tensor.inputs) == 1 else None
    if producer is not None and producer.op == "Constant" \
            and isinstance(producer.attrs.get("value"), gs.Constant):
        return np.asarray(producer.attrs["value"].values)
    return None


def to_graph(model: onnx.ModelProto) -> gs.Graph:
    """Imports ``model`` into onnx-graphsurgeon (the copy is independent of ``model``)."""
    return gs.import_onnx(model)


def to_model(graph: gs.Graph, like: onnx.ModelProto | None = None) -> onnx.ModelProto:
    """Exports a graph, cleaned and topologically sorted, keeping the metadata of ``like``."""
    graph.cleanup(remove_unused_graph_inputs=False).toposort()
    kwargs = {}
    if like is not None:
        kwargs = {"producer_name": like.producer_name or "quantdbg", "ir_version": like.ir_version}
    model = gs.export_onnx(graph, do_type_check=False, **kwargs)
    if like is not None:
        del model.opset_import[:]
        model.opset_import.extend(like.opset_import)
        model.metadata_props.extend(like.metadata_props)
    return model


def save_model(model: onnx.ModelProto, path: str | os.PathLike) -> Path:
    """Writes ``model`` atomically: to a temporary file in the same folder, then renamed.

    Models over 2 GB get their weights in ``<name>.data`` beside the file.

    Args:
        model: The model to write.
        path: Destination ``.onnx`` path; its folder must exist.

    Returns:
        The destination path.

    Raises:
        ModelError: The destination folder does not exist.
    """
    dest = Path(path)
    if not dest.parent.is_dir():
        raise ModelError(f"Cannot write {str(dest)!r}: folder {str(dest.parent)!r} does not exist.")
    if fits_in_protobuf(model):
        return write_bytes_atomic(dest, model.SerializeToString())
    copy = onnx.ModelProto()
    copy.CopyFrom(model)  # externalising rewrites the initializers
    # What onnx.save does with save_as_external_data: the weights go to <name>.data first, then the
    # graph that points at them is written (atomically, so a reader never sees it without them).
    external_data_helper.convert_model_to_external_data(copy, location=dest.name + ".data")
    external_data_helper.write_external_data_tensors(copy, str(dest.parent))
    return write_bytes_atomic(dest, copy.SerializeToString())
