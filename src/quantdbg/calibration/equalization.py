"""Cross-layer equalization (Nagel et al., "Data-Free Quantization Through Weight Equalization and Bias
Correction", ICCV 2019; AIMET's CLE): per-channel rescaling of consecutive layers that keeps the FP32
function exact and balances their channel ranges.

For ``y = L2(act(L1(x)))`` with ``act`` positively homogeneous and per channel (Relu, LeakyRelu,
nothing, or up to three of them with MaxPool/AveragePool),
dividing output channel ``i`` of ``L1`` (its weights and bias) by ``s_i > 0`` and multiplying the
weights of ``L2`` that read channel ``i`` by ``s_i`` changes nothing in FP32, since
``act(z / s) = act(z) / s``. With ``r1_i`` the range (max |w|) of output channel ``i`` of ``L1``
and ``r2_i`` that of the weights of ``L2`` reading it, ``s_i = sqrt(r1_i * r2_i) / r2_i`` makes both
``sqrt(r1_i * r2_i)``: the channel ranges balance, so the activation between the layers (one scale
per tensor) no longer crushes its small channels, and each weight's per-channel grid is used better.

Pairs are Conv or Gemm into Conv or Gemm, depthwise Conv included on either side (a depthwise
Conv's input channel ``i`` is its output channel ``i``, so it can sit in two pairs:
Conv -> Relu -> depthwise Conv -> Relu -> Conv). Layers in a chain share scales, so the scales are
found by sweeping the pairs until no scale moves by more than :data:`TOLERANCE` (on per-channel
maxima of the weights, not the weights), then every weight is rescaled once.

A ReLU6 (``Clip(z, 0, 6)``) is crossed by rescaling its ceiling: channel ``i`` is clipped at
``6 / s_i``, which one Clip cannot express, so it becomes ``Clip(z, 0)`` followed by a ``Min`` with
the per-channel ceilings (writing the Clip's output tensor; TensorRT runs the Min as an elementwise
layer). Other bounded activations are not crossed, nor are layers whose weight or bias another node
also reads, or an intermediate tensor another node (or the graph output) reads. Node names of the
layers and every tensor name are unchanged, so plans and calibrator choices made on the original
model apply.

The transform is idempotent: an equalized model is balanced (and a rescaled ReLU6 is no longer
crossed), so equalizing it again changes nothing.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from quantdbg import _json
from quantdbg.model import LoadedModel
from quantdbg.model.external import fits_in_protobuf
from quantdbg.model.graph import constant_values, to_graph, to_model, trans_b
from quantdbg.model.load import ModelSource, as_loaded
from quantdbg.model.names import UniqueNames
from quantdbg.model.staging import check_model

logger = logging.getLogger(__name__)

TOLERANCE = 1e-6
"""Sweeps stop when no scale moves by more than this (relative); a model whose scales are all within
it of 1 is returned unchanged."""

MAX_SWEEPS = 500
"""Sweeps over the pairs at most (a chain balances in a few dozen)."""

_HOMOGENEOUS = frozenset({"Relu", "LeakyRelu", "Identity", "MaxPool", "AveragePool"})
"""Per-channel ops with ``f(s * z) = s * f(z)`` for every ``s > 0``: scales pass through them."""
_MAX_BETWEEN = 3


@dataclass(frozen=True)
class EqualizedPair(_json.Serializable):
    """One pair of layers whose shared channels were rescaled.

    Attributes:
        first: The layer whose output channels were divided by ``s`` (weights and bias).
        second: The layer whose input channels were multiplied by ``s``.
        activation: The ops between them, ``+``-joined (``""``: none).
        channels: Number of shared channels.
        scale_min: Smallest ``s_i``.
        scale_max: Largest ``s_i``.
        imbalance_before: Largest over smallest ``r1_i / r2_i`` of the live channels, before.
        imbalance_after: The same after (1.0: balanced).
    """

    first: str
    second: str
    activation: str
    channels: int
    scale_min: float
    scale_max: float
    imbalance_before: float
    imbalance_after: float


@dataclass(frozen=True)
class Equalization(_json.Serializable):
    """What cross-layer equalization did to a model.

    Attributes:
        pairs: The pairs rescaled, in graph order (empty: nothing to equalize, or already balanced).
        sweeps: Sweeps over the pairs until the scales settled.
    """

    pairs: tuple[EqualizedPair, ...] = ()
    sweeps: int = 0


@dataclass(frozen=True)
class EqualizationResult:
    """The equalized model and what was done.

    Attributes:
        model: The equalized FP32 model (the input itself when nothing changed).
        equalization: The pairs and their scales.
    """

    model: LoadedModel
    equalization: Equalization


class _Layer:
    """A weighted node's per-channel view: ``reduced[o, i]`` = max |w| over the kernel of output ``o``,
    input ``i`` (one input per output for a depthwise Conv), and the scales found so far."""

    def __init__(self, node: gs.Node, weight: np.ndarray) -> None:
        self.node = node
        self.depthwise = node.op == "Conv" and int(node.attrs.get("group", 1)) > 1
        self.reduced = _reduced(node, weight)
        self.out_scale = np.ones(self.reduced.shape[0])  # output channel o divided by it
        self.in_scale = np.ones(self.reduced.shape[0] if self.depthwise else self.reduced.shape[1])

    def out_ranges(self) -> np.ndarray:
        ins = self.in_scale[:, None] if self.depthwise else self.in_scale[None, :]
        return (self.reduced * ins).max(axis=1) / self.out_scale

    def in_ranges(self) -> np.ndarray:
        if self.depthwise:
            return self.reduced[:, 0] * self.in_scale / self.out_scale
        return (self.reduced / self.out_scale[:, None]).max(axis=0) * self.in_scale


@dataclass
class _Pair:
    first: _Layer
    second: _Layer
    activation: str
    clips: list[gs.Node]
    before: np.ndarray | None = None


def _reduced(node: gs.Node, weight: np.ndarray) -> np.ndarray:
    """max |w| per (output channel, input channel) in float64; Gemm weights oriented [out, in]."""
    w = np.abs(np.asarray(weight, np.float64))
    if node.op == "Gemm":
        return w if trans_b(node) else w.T
    return w.reshape(w.shape[0], w.shape[1], -1).max(axis=2)


def _equalizable(node: gs.Node) -> str | None:
    """Why ``node`` cannot take part in a pair (None: it can)."""
    if node.op not in ("Conv", "Gemm") or len(node.inputs) < 2:
        return "not a Conv or Gemm"
    weight = node.inputs[1]
    values = constant_values(weight)
    if not isinstance(weight, gs.Constant) or values is None or values.dtype != np.float32:
        return "its weight is not a float32 initializer"
    if len(weight.outputs) != 1:
        return "another node reads its weight"
    if len(node.inputs) > 2 and node.inputs[2].name:
        bias = node.inputs[2]
        if not isinstance(bias, gs.Constant) or len(bias.outputs) != 1:
            return "its bias is not an initializer of its own"
    if node.op == "Gemm" and (node.attrs.get("transA", 0) or values.ndim != 2):
        return "Gemm with transA"
    group = int(node.attrs.get("group", 1)) if node.op == "Conv" else 1
    if group > 1 and not (values.shape[1] == 1 and values.shape[0] == group):
        return "grouped Conv that is not depthwise with one output per group"
    return None


def _next_layer(node: gs.Node, outputs: set[str]) -> tuple[gs.Node, list[gs.Node]] | None:
    """The layer reading ``node``'s output alone through positively homogeneous ops (a Clip at 0 and a
    constant ceiling among them), and those ops."""
    tensor, between = node.outputs[0], []
    while True:
        if tensor.name in outputs or len(tensor.outputs) != 1:
            return None
        reader = tensor.outputs[0]
        if reader.op in ("Conv", "Gemm"):
            return (reader, between) if reader.inputs[0] is tensor else None
        homogeneous = reader.op in _HOMOGENEOUS or _ceiling(reader) is not None
        if not homogeneous or len(reader.outputs) != 1 or len(between) == _MAX_BETWEEN:
            return None
        tensor = reader.outputs[0]
        between.append(reader)


def _ceiling(node: gs.Node) -> float | None:
    """The upper bound of a ``Clip(z, 0, ceiling)`` (ReLU6), else None: only its ceiling needs rescaling."""
    if node.op != "Clip" or len(node.inputs) != 3 or not node.inputs[1].name or not node.inputs[2].name:
        return None
    low, high = constant_values(node.inputs[1]), constant_values(node.inputs[2])
    if low is None or high is None or low.size != 1 or high.size != 1 or float(low) != 0.0:
        return None
    return float(high) if np.isfinite(high) and float(high) > 0 else None


def _pairs(graph: gs.Graph) -> list[_Pair]:
    outputs = {t.name for t in graph.outputs}
    layers: dict[int, _Layer] = {}

    def layer(node: gs.Node) -> _Layer:
        if id(node) not in layers:
            layers[id(node)] = _Layer(node, constant_values(node.inputs[1]))
        return layers[id(node)]

    found = []
    for node in graph.nodes:
        if _equalizable(node) is not None:
            continue
        following = _next_layer(node, outputs)
        if following is None or _equalizable(following[0]) is not None:
            continue
        first, second = layer(node), layer(following[0])
        if first.reduced.shape[0] != second.in_scale.shape[0]:
            continue  # a Flatten/Reshape would sit between them; shapes disagree otherwise
        between = following[1]
        clips = [n for n in between if n.op == "Clip"]
        found.append(_Pair(first, second, "+".join(n.op for n in between), clips))
    return found


def _sweep(pairs: list[_Pair]) -> float:
    """Balances each pair in turn; returns the largest relative move of a scale."""
    moved = 0.0
    for pair in pairs:
        r1, r2 = pair.first.out_ranges(), pair.second.in_ranges()
        live = (r1 > 0) & (r2 > 0) & np.isfinite(r1) & np.isfinite(r2)
        step = np.ones_like(r1)
        step[live] = np.sqrt(r1[live] / r2[live])  # sqrt(r1 * r2) / r2
        pair.first.out_scale *= step
        pair.second.in_scale *= step
        moved = max(moved, float(np.max(np.abs(step - 1.0), initial=0.0)))
    return moved


def _imbalance(r1: np.ndarray, r2: np.ndarray) -> float:
    live = (r1 > 0) & (r2 > 0)
    ratio = r1[live] / r2[live]
    return float(ratio.max() / ratio.min()) if ratio.size else 1.0


def _rescale(layer: _Layer) -> None:
    """Writes the scales into the layer's weight (and bias), each initializer once."""
    node = layer.node
    weight = np.asarray(constant_values(node.inputs[1]), np.float64)
    out = 1.0 / layer.out_scale
    if node.op == "Gemm":
        oriented = weight if trans_b(node) else weight.T
        oriented = oriented * out[:, None] * layer.in_scale[None, :]
        weight = oriented if trans_b(node) else oriented.T
    else:
        shape = (-1,) + (1,) * (weight.ndim - 1)
        weight = weight * out.reshape(shape)
        if layer.depthwise:
            weight = weight * layer.in_scale.reshape(shape)
        else:
            weight = weight * layer.in_scale.reshape((1, -1) + (1,) * (weight.ndim - 2))
    node.inputs[1].values = np.ascontiguousarray(weight, np.float32)
    if len(node.inputs) > 2 and node.inputs[2].name and not np.all(out == 1.0):
        bias = np.asarray(constant_values(node.inputs[2]), np.float64)
        node.inputs[2].values = np.ascontiguousarray(bias * out, np.float32)  # channels on the last axis


def equalize(model: ModelSource) -> EqualizationResult:
    """Cross-layer equalization of a copy of ``model`` (module docstring).

    Args:
        model: FP32 model: path, ModelProto (never modified) or LoadedModel.

    Returns:
        The equalized model and its pairs; the model itself (same object) when no pair needs
        rescaling.

    Raises:
        ModelError: The model is invalid or already quantized.
    """
    loaded = as_loaded(model)
    graph = to_graph(loaded.proto)
    pairs = _pairs(graph)
    for pair in pairs:
        pair.before = np.stack([pair.first.out_ranges(), pair.second.in_ranges()])
    sweeps = 0
    while pairs and sweeps < MAX_SWEEPS:
        sweeps += 1
        if _sweep(pairs) <= TOLERANCE:
            break
    layers = {id(p.first): p.first for p in pairs} | {id(p.second): p.second for p in pairs}
    changed = [la for la in layers.values() if _moved(la.out_scale) or _moved(la.in_scale)]
    if not changed:
        return EqualizationResult(loaded, Equalization((), sweeps))
    if sweeps == MAX_SWEEPS:
        logger.warning("cross-layer equalization: the scales still moved after %d sweeps", MAX_SWEEPS)
    records = tuple(_record(p) for p in pairs if _moved(p.first.out_scale))
    for layer in changed:
        _rescale(layer)
    names = UniqueNames.of_graph(graph)
    for pair in pairs:
        for clip in pair.clips if _moved(pair.first.out_scale) else ():
            _per_channel_ceiling(graph, clip, pair.first, names)
    equalized = to_model(graph, like=loaded.proto)
    result = LoadedModel(_checked(equalized), False, loaded.folded)
    return EqualizationResult(result, Equalization(records, sweeps))


def _per_channel_ceiling(graph: gs.Graph, clip: gs.Node, first: _Layer, names: UniqueNames) -> None:
    """``Clip(z, 0, c)`` of channels divided by ``s`` becomes ``Clip(z, 0)`` then ``Min(., c / s)``; the
    Min writes the Clip's output tensor, so tensor names (and calibrator choices) stay."""
    ceiling = _ceiling(clip)
    assert ceiling is not None
    node = first.node
    shape = (-1,) + (1,) * (len(node.inputs[1].shape) - 2) if node.op == "Conv" else (-1,)
    ceilings = (ceiling / first.out_scale).astype(np.float32).reshape(shape)
    bound = gs.Constant(names(f"{clip.name}/ceiling"), ceilings)
    out = clip.outputs[0]
    unbounded = gs.Variable(names(f"{out.name}/unbounded"), out.dtype, out.shape)
    clip.inputs[2] = gs.Variable.empty()
    clip.outputs[0] = unbounded
    graph.nodes.append(gs.Node("Min", names(f"{clip.name}/Min"), inputs=[unbounded, bound], outputs=[out]))


def _moved(scale: np.ndarray) -> bool:
    return bool(np.any(np.abs(scale - 1.0) > TOLERANCE))


def _record(pair: _Pair) -> EqualizedPair:
    assert pair.before is not None
    scale = pair.first.out_scale
    after = _imbalance(pair.first.out_ranges(), pair.second.in_ranges())
    return EqualizedPair(pair.first.node.name, pair.second.node.name, pair.activation, int(scale.size),
                         float(scale.min()), float(scale.max()), _imbalance(*pair.before), after)


def _checked(model: onnx.ModelProto) -> onnx.ModelProto:
    """The equalized model, checked when protobuf can hold it (only initializer values changed)."""
    if fits_in_protobuf(model):
        try:
            check_model(model)
        except Exception as err:  # a bug in quantdbg, not a user error
            raise AssertionError(f"cross-layer equalization produced an invalid ONNX model: {err}") from err
    return model


__all__ = ["MAX_SWEEPS", "TOLERANCE", "EqualizationResult", "Equalization", "EqualizedPair", "equalize"]
