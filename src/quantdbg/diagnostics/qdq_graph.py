"""A read-only view of a Q/DQ ONNX graph for the lint: producers, consumers, constants, Q/DQ pairs.

Works on any Q/DQ model (quantdbg's, ONNX Runtime's, ModelOpt's): it reads the graph syntactically
and never modifies it. A weight is whatever constants alone compute: an initializer, a Constant
node's output, or a chain of nodes over them (Transpose, Cast, ... evaluated on a copy). An
initializer's values are read only when a check asks for them (:class:`LazyConstant`), so the view
holds no weight and a check over every weight holds one at a time.
"""
from __future__ import annotations

from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx

from quantdbg.model.external import tensor_array
from quantdbg.model.graph import constant_node_value, trans_b
from quantdbg.model.weights import WEIGHTED_OPS, computed_constants
from quantdbg.quant_math import QMAX, channel_scale, fake_quant, sqnr_db, weight_axis

CLIP_TOLERANCE = 0.01
"""Share of max|w| a weight's INT8 range may fall short of before the weight counts as clipped (a
scale of max|w|/127.5, ONNX Runtime's symmetric rule, clips only the largest weight by half a step)."""


def attr(node: onnx.NodeProto, name: str, default: Any) -> Any:
    """The value of a node attribute, or ``default`` when the node does not set it."""
    for attribute in node.attribute:
        if attribute.name == name:
            return onnx.helper.get_attribute_value(attribute)
    return default


@dataclass(frozen=True)
class QdqNodeParams:
    """A Q or DQ node's quantization parameters, where they are constants.

    Attributes:
        scale: The scale (None when it is computed).
        zero_point: The zero point (None when absent or computed).
        axis: The ``axis`` attribute (1 by default).
        int_dtype: The integer type: the zero point's, or a pre-quantized integer weight's.
    """

    scale: np.ndarray | None
    zero_point: np.ndarray | None
    axis: int
    int_dtype: np.dtype | None


class LazyConstant:
    """A constant's shape and element type, with its values read on demand.

    An initializer's values are read at each :meth:`values` call (from its data file for a weight
    kept there) and not kept; values already in memory (a Constant node's, a computed chain's)
    are returned as they are.

    Args:
        shape: The dimensions.
        dtype: The NumPy element type.
        read: Returns the values.
    """

    def __init__(self, shape: tuple[int, ...], dtype: np.dtype, read: Callable[[], np.ndarray]) -> None:
        self.shape = shape
        self.dtype = dtype
        self._read = read

    @classmethod
    def of_tensor(cls, tensor: onnx.TensorProto) -> LazyConstant:
        """An initializer, read (by :func:`~quantdbg.model.tensor_array`) only when asked for."""
        dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type))
        return cls(tuple(int(d) for d in tensor.dims), dtype, lambda: tensor_array(tensor))

    @classmethod
    def of_array(cls, values: np.ndarray) -> LazyConstant:
        """Values already in memory."""
        return cls(values.shape, values.dtype, lambda: values)

    @property
    def ndim(self) -> int:
        """The number of dimensions."""
        return len(self.shape)

    def values(self) -> np.ndarray:
        """The values (read now for an initializer)."""
        return self._read()


class QdqGraph:
    """Producer/consumer maps and constants of one ONNX graph (read-only).

    Attributes:
        constants: Every constant by name (initializers, Constant node outputs, what chains of
            nodes over them feed a QuantizeLinear), its values read on demand.
    """

    def __init__(self, model: onnx.ModelProto) -> None:
        graph = model.graph
        self.nodes = list(graph.node)
        self.outputs = {vi.name for vi in graph.output}
        self.producer: dict[str, onnx.NodeProto] = {}
        self.consumers: dict[str, list[onnx.NodeProto]] = {}
        self.constants: dict[str, LazyConstant] = {init.name: LazyConstant.of_tensor(init)
                                                   for init in graph.initializer}
        for node in self.nodes:
            for name in node.output:
                self.producer[name] = node
            for name in node.input:
                if name:
                    self.consumers.setdefault(name, []).append(node)
            if node.op_type == "Constant" and node.output:
                value = constant_node_value(node)
                if value is not None:
                    self.constants[node.output[0]] = LazyConstant.of_array(value)
        # What a QuantizeLinear reads through Transpose/Cast/... of constants is a weight too.
        computed = [n.input[0] for n in self.nodes if n.op_type == "QuantizeLinear" and n.input
                    and n.input[0] not in self.constants]
        self.constants.update((name, LazyConstant.of_array(values))
                              for name, values in computed_constants(model, computed).items())

    def value(self, tensor: str) -> np.ndarray | None:
        """The values of a constant (read now for an initializer), or None when it is no constant."""
        found = self.constants.get(tensor)
        return found.values() if found is not None else None

    def of_type(self, ops: Collection[str]) -> Iterator[onnx.NodeProto]:
        """The nodes whose op type is one of ``ops``, in graph order."""
        return (node for node in self.nodes if node.op_type in ops)

    def producer_op(self, tensor: str) -> str | None:
        """The op type producing ``tensor`` (None for a graph input or initializer)."""
        node = self.producer.get(tensor)
        return node.op_type if node is not None else None

    def dq_of(self, tensor: str) -> onnx.NodeProto | None:
        """The DequantizeLinear producing ``tensor``, if any."""
        node = self.producer.get(tensor)
        return node if node is not None and node.op_type == "DequantizeLinear" else None

    def q_before(self, dq: onnx.NodeProto) -> onnx.NodeProto | None:
        """The QuantizeLinear feeding ``dq``, if any."""
        node = self.producer.get(dq.input[0])
        return node if node is not None and node.op_type == "QuantizeLinear" else None

    def weight_of(self, dq: onnx.NodeProto) -> LazyConstant | None:
        """The constant a DequantizeLinear dequantizes (directly or through a Q), or None."""
        source = dq.input[0]
        q = self.q_before(dq)
        if q is not None:
            source = q.input[0]
        return self.constants.get(source)

    def quantized_consumers(self, tensor: str) -> list[onnx.NodeProto]:
        """QuantizeLinear nodes reading ``tensor``."""
        return [c for c in self.consumers.get(tensor, []) if c.op_type == "QuantizeLinear"]

    def qparams(self, node: onnx.NodeProto) -> QdqNodeParams:
        """The constant quantization parameters of a Q or DQ node."""
        scale = self.value(node.input[1]) if len(node.input) > 1 else None
        zp = self.value(node.input[2]) if len(node.input) > 2 and node.input[2] else None
        dtype = zp.dtype if zp is not None else None
        if dtype is None and node.op_type == "DequantizeLinear" and node.input[0] in self.constants:
            dtype = self.constants[node.input[0]].dtype  # pre-quantized integer weights
        return QdqNodeParams(scale, zp, int(attr(node, "axis", 1)), dtype)

    def pairs(self) -> Iterator[tuple[onnx.NodeProto, onnx.NodeProto | None]]:
        """(reported node, its Q partner) for every DQ, and every Q that feeds no DQ."""
        for node in self.nodes:
            if node.op_type == "DequantizeLinear":
                yield node, self.q_before(node)
            elif node.op_type == "QuantizeLinear":
                if not any(c.op_type == "DequantizeLinear" for c in self.consumers.get(node.output[0], [])):
                    yield node, None

    def is_weight(self, node: onnx.NodeProto) -> bool:
        """Whether a Q or DQ node quantizes a constant."""
        if node.op_type == "DequantizeLinear":
            return self.weight_of(node) is not None
        return node.input[0] in self.constants

    def weight_inputs(self) -> Iterator[tuple[onnx.NodeProto, onnx.NodeProto, LazyConstant]]:
        """(weighted op, DQ on its input 1, the weight constant) for every dequantized weight; no
        weight is read."""
        for node in self.nodes:
            if node.op_type in WEIGHTED_OPS and len(node.input) > 1:
                dq = self.dq_of(node.input[1])
                weight = self.weight_of(dq) if dq is not None else None
                if dq is not None and weight is not None and weight.ndim >= 1:
                    yield node, dq, weight

    def weighted_source(self, tensor: str) -> onnx.NodeProto | None:
        """The weighted op whose output reaches ``tensor`` through exactly one Q -> DQ pair."""
        dq = self.dq_of(tensor)
        q = self.q_before(dq) if dq is not None else None
        producer = self.producer.get(q.input[0]) if q is not None else None
        return producer if producer is not None and producer.op_type in WEIGHTED_OPS else None


def output_channel_axis(node: onnx.NodeProto, rank: int) -> int | None:
    """Output-channel axis of input 1 of a weighted op (None: the weight has no channel axis)."""
    return weight_axis(node.op_type, rank, trans_b(node))


def channel_counts(node: onnx.NodeProto, weight: np.ndarray | LazyConstant) -> tuple[int, int] | None:
    """(input channels, output channels) of a weighted op, from its weight's shape."""
    group = int(attr(node, "group", 1))
    if node.op_type == "Conv" and weight.ndim >= 3:
        return int(weight.shape[1]) * group, int(weight.shape[0])
    if node.op_type == "ConvTranspose" and weight.ndim >= 3:
        return int(weight.shape[0]), int(weight.shape[1]) * group
    if node.op_type == "Gemm" and weight.ndim == 2:
        rows, cols = (int(d) for d in weight.shape)
        return (cols, rows) if trans_b(node) else (rows, cols)
    if node.op_type == "MatMul" and weight.ndim >= 2:
        return int(weight.shape[-2]), int(weight.shape[-1])
    return None


def pair_name(node: onnx.NodeProto, q: onnx.NodeProto | None) -> str:
    """How a message names a Q/DQ pair: ``'q' -> 'dq'``, or the lone node."""
    return f"{q.name!r} -> {node.name!r}" if q is not None else repr(node.name)


def preview(values: np.ndarray, limit: int = 4) -> str:
    """A few values of an array for a message (``[0.01, 0.02, ...]``; a scalar as itself)."""
    flat = np.asarray(values).reshape(-1)
    shown = ", ".join(f"{v:.6g}" for v in flat[:limit].tolist())
    return f"[{shown}{', ...' if flat.size > limit else ''}]" if flat.size > 1 else shown


@dataclass(frozen=True)
class WeightQuantization:
    """A dequantized weight's INT8 quantization, measured against TensorRT's rule (per output channel,
    scale max|w|/127).

    Attributes:
        tensor: The weight (what the QuantizeLinear reads, or the DequantizeLinear's constant).
        channels: Its output channels (1 when it has no channel axis).
        scales: How many scales the model uses for it (1: per tensor).
        clipped: How many of those scales are below their slice's max|w|/127 (by more than
            :data:`CLIP_TOLERANCE`).
        sqnr_db: The weight's SQNR with the model's own scales and zero points.
        per_channel_sqnr_db: Its SQNR with one scale max|w|/127 per output channel.
    """

    tensor: str
    channels: int
    scales: int
    clipped: int
    sqnr_db: float
    per_channel_sqnr_db: float

    @property
    def loss_db(self) -> float:
        """SQNR lost against per-channel quantization (dB)."""
        return self.per_channel_sqnr_db - self.sqnr_db


def _along(values: np.ndarray, axis: int | None, rank: int) -> np.ndarray:
    """Per-slice values shaped to broadcast along ``axis`` of a rank-``rank`` array (as they are for None)."""
    if axis is None or values.size == 1:
        return values.reshape(())
    shape = [1] * rank
    shape[axis] = -1
    return values.reshape(shape)


def _weight_sqnr(weight: np.ndarray, dequantized: np.ndarray) -> float:
    return sqnr_db(float(np.square(weight).sum()), float(np.square(weight - dequantized).sum()))


def weight_quantization(g: QdqGraph, node: onnx.NodeProto, dq: onnx.NodeProto,
                        weight: np.ndarray | LazyConstant) -> WeightQuantization | None:
    """How the Q/DQ pair on a weighted op's weight quantizes it (None: not a float weight, or a
    scale that is not constant).

    Args:
        g: The graph.
        node: The weighted op.
        dq: The DequantizeLinear on its weight input.
        weight: The weight (from :meth:`QdqGraph.weight_inputs`; read here, and let go on return).
    """
    q = g.q_before(dq)
    params = g.qparams(q if q is not None else dq)
    if params.scale is None or not np.issubdtype(weight.dtype, np.floating) or weight.ndim == 0:
        return None
    w = (weight.values() if isinstance(weight, LazyConstant) else weight).astype(np.float64)
    axis = params.axis % w.ndim if params.scale.size > 1 else None
    if axis is not None and params.scale.size != w.shape[axis]:
        return None  # a malformed pair: onnx.checker and ONNX Runtime reject it
    scale = _along(params.scale.astype(np.float64), axis, w.ndim)
    zero = _along(np.zeros(1) if params.zero_point is None else params.zero_point.astype(np.float64),
                  axis, w.ndim)
    info = np.iinfo(params.int_dtype) if params.int_dtype is not None and \
        np.issubdtype(params.int_dtype, np.integer) else np.iinfo(np.int8)
    # clip(round(w/s) + z, lo, hi) - z, in s units: shifting by the (integer) zero point commutes with round.
    ours = fake_quant(w + zero * scale, scale, int(info.min), int(info.max)) - zero * scale
    slice_amax = np.abs(w).max(axis=tuple(a for a in range(w.ndim) if a != axis), keepdims=True) \
        if axis is not None else np.abs(w).max()
    clipped = int(np.count_nonzero(scale * QMAX < slice_amax * (1 - CLIP_TOLERANCE)))
    out_axis = output_channel_axis(node, w.ndim)
    reference = fake_quant(w, channel_scale(w, out_axis))
    return WeightQuantization(q.input[0] if q is not None else dq.input[0],
                              1 if out_axis is None else int(w.shape[out_axis]), int(params.scale.size),
                              clipped, _weight_sqnr(w, ours), _weight_sqnr(w, reference))
