"""Weight discovery: every input of a Conv, ConvTranspose, Gemm or MatMul that constants alone compute
is a weight, whatever holds it.

Exporters store weights in initializers (PyTorch), in ``Constant`` nodes (Paddle, many opset-12
exports), behind ``Transpose``/``Reshape``/``Unsqueeze``/``Squeeze``/``Identity`` (tf2onnx, Keras,
tied embeddings), behind ``Cast`` from float16 (half-precision exports), or list initializers as
graph inputs too (IR < 4). A weight that placement took for an activation would get one per-tensor
scale chosen by an activation calibrator, usually clipped, and the model collapses. So the loaded
copy of an FP32 model (never the caller's model) gets each such weight folded into an initializer
of the same name -- evaluated by onnx-graphsurgeon's ``fold_constants`` restricted to the nodes that
compute weights, so nothing else in the graph changes -- and every fold is recorded as a
:class:`FoldedWeight`.
"""
from __future__ import annotations

import contextlib
import sys
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import onnx
import onnx_graphsurgeon as gs
from onnx_graphsurgeon.logger import G_LOGGER

from quantdbg._json import Serializable
from quantdbg.errors import ModelError
from quantdbg.model.external import constant_array
from quantdbg.model.graph import to_graph, to_model
from quantdbg.model.names import name_graph_nodes
from quantdbg.quant_math import FP16_MAX, ZEROING_FACTOR, channel_amax, fp16_split, outliers_zero_the_rest

WEIGHTED_OPS = frozenset({"Conv", "ConvTranspose", "Gemm", "MatMul"})
"""Ops with a weight: TensorRT runs them as INT8 GEMM/convolution kernels when all their inputs are
dequantized, and their inputs 0 and 1 are weights when constants alone compute them."""

# Ops whose output is not a function of their inputs (random), or must run at run time (Q/DQ; the
# same rule as onnx-graphsurgeon's fold_constants): never folded, so what they compute is no weight.
_NOT_CONSTANT = frozenset({"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike",
                           "Multinomial", "Bernoulli", "QuantizeLinear", "DequantizeLinear",
                           "DynamicQuantizeLinear"})
_SUBGRAPH_ATTRS = (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
_GRAPH_INPUT = "initializer also listed as a graph input"


@dataclass(frozen=True)
class FoldedWeight(Serializable):
    """A weight that was not a plain initializer, and what loading did about it.

    Attributes:
        node: The weighted node reading it.
        input_index: Which of its inputs (0 or 1).
        tensor: The tensor it reads (the folded initializer keeps this name).
        ops: Op types of the nodes that computed it, in graph order (``("Constant",)``,
            ``("Transpose",)``, ``("Cast",)``, ...); empty for an initializer that was also
            listed as a graph input.
        sources: The initializers those nodes read (empty for a Constant node).
    """

    node: str
    input_index: int
    tensor: str
    ops: tuple[str, ...]
    sources: tuple[str, ...] = ()

    @property
    def held(self) -> str:
        """How the model held it: ``Constant node``, ``Transpose of initializer 'w'``, ``graph input``."""
        if not self.ops:
            return _GRAPH_INPUT
        computed = [op for op in self.ops if op != "Constant"]
        if not computed:
            return "Constant node"
        of = (f"initializer {', '.join(repr(s) for s in self.sources)}" if self.sources
              else "a Constant node")
        return f"{' -> '.join(computed)} of {of}"

    @property
    def kind(self) -> str:
        """The short form a summary counts by: ``Constant nodes``, ``behind Transpose``, ``graph inputs``."""
        if not self.ops:
            return "initializers also listed as graph inputs"
        computed = [op for op in self.ops if op != "Constant"]
        return f"behind {'/'.join(dict.fromkeys(computed))}" if computed else "in Constant nodes"

    @property
    def action(self) -> str:
        """What loading did: folded it into an initializer, or dropped the graph input."""
        return "dropped from the graph inputs" if not self.ops else "folded into an initializer"

    def describe(self) -> str:
        """One line, e.g. ``fc1 input 1 'w': Transpose of initializer 'w_t', folded into an initializer``."""
        return f"{self.node} input {self.input_index} {self.tensor!r}: {self.held}, {self.action}"


def summarize_folded(items: Sequence[FoldedWeight]) -> str:
    """One line: how many weights were held how, and what was done, e.g. ``3 weight(s) were not plain
    initializers (2 in Constant nodes, 1 behind Transpose): folded into initializers``."""
    kinds = Counter(w.kind for w in items)
    held = ", ".join(f"{n} {kind}" for kind, n in kinds.items())
    actions = " and ".join(dict.fromkeys(
        "folded into initializers" if w.ops else "dropped from the graph inputs" for w in items))
    return f"{len(items)} weight(s) were not plain initializers ({held}): {actions}"


def constant_tensors(model: onnx.ModelProto) -> frozenset[str]:
    """Names of the tensors constants alone compute: initializers, Constant outputs and their descendants.

    A node counts when every input it reads is such a tensor, it is deterministic, it is no
    Q/DQ op and it holds no subgraph. Graph inputs (other than initializers) are never constant.

    Args:
        model: A model whose nodes are topologically sorted (as the ONNX checker requires).
    """
    known = {init.name for init in model.graph.initializer}
    known |= {init.values.name for init in model.graph.sparse_initializer}
    for node in model.graph.node:
        if node.op_type in _NOT_CONSTANT or any(a.type in _SUBGRAPH_ATTRS for a in node.attribute):
            continue
        if all(not name or name in known for name in node.input):
            known.update(name for name in node.output if name)
    return frozenset(known)


def _weight_inputs(graph: gs.Graph, computable: frozenset[str]) -> list[tuple[str, int, str]]:
    """(node, input index, tensor) of every weight input that constants compute but is no initializer."""
    return [(node.name, index, tensor.name) for node in graph.nodes if node.op in WEIGHTED_OPS
            for index, tensor in enumerate(node.inputs[:2])
            if tensor.name in computable and not isinstance(tensor, gs.Constant)]


def _needs_folding(model: onnx.ModelProto, computable: frozenset[str]) -> bool:
    inits = {init.name for init in model.graph.initializer}
    return any(name in computable and name not in inits for node in model.graph.node
               if node.op_type in WEIGHTED_OPS for name in node.input[:2] if name)


def _ancestors(tensor: gs.Tensor) -> list[gs.Node]:
    """The nodes computing ``tensor``, each once."""
    found: dict[int, gs.Node] = {}
    stack = [tensor]
    while stack:
        for node in stack.pop().inputs:
            if id(node) not in found:
                found[id(node)] = node
                stack.extend(node.inputs)
    return list(found.values())


@contextlib.contextmanager
def _quiet_graphsurgeon() -> Iterator[None]:
    # fold_constants reports what it could not evaluate as warnings on stdout; quantdbg raises its
    # own error for a weight left unfolded instead.
    severity = G_LOGGER.severity
    G_LOGGER.severity = G_LOGGER.CRITICAL
    try:
        yield
    finally:
        G_LOGGER.severity = severity


def _evaluate(graph: gs.Graph, chains: Mapping[str, list[gs.Node]]) -> dict[str, np.ndarray]:
    """Values of the tensors ``chains`` maps to their computing nodes (those that could be evaluated).

    The graph is not modified: a copy is folded, restricted (by node name, so the graph's nodes must
    be uniquely named) to the nodes of the chains. One ONNX Runtime session evaluates every chain;
    only when that fails are the chains evaluated one by one, so one bad chain spoils no other.
    """
    folding = {node.name for nodes in chains.values() for node in nodes}
    values: dict[str, np.ndarray] = {}
    for partitioning in (None, "recursive"):
        clone = graph.copy()
        _load_chain_inputs(clone, folding)
        with _quiet_graphsurgeon():
            clone.fold_constants(fold_shapes=False, recurse_subgraphs=False, flatten_subgraphs=False,
                                 partitioning=partitioning, size_threshold=sys.maxsize,
                                 should_exclude_node=lambda node: node.name not in folding)
        tensors = clone.tensors()
        values = {name: constant_array(tensors[name]) for name in chains
                  if isinstance(tensors.get(name), gs.Constant)}
        if len(values) == len(chains):
            break
    return values


def _load_chain_inputs(graph: gs.Graph, folding: set[str]) -> None:
    """Reads the external weights the folded nodes use into ``graph`` (a copy): the folding
    evaluates them in ONNX Runtime, which does not know their data file's folder."""
    for node in graph.nodes:
        if node.name in folding:
            for tensor in node.inputs:
                if isinstance(tensor, gs.Constant):
                    tensor.values = constant_array(tensor)


def _chain_record(node: str, index: int, tensor: str, chain: list[gs.Node], order: Mapping[int, int]
                  ) -> FoldedWeight:
    ops = tuple(n.op for n in sorted(chain, key=lambda n: order[id(n)]))
    sources = sorted({t.name for n in chain for t in n.inputs if isinstance(t, gs.Constant) and t.name})
    return FoldedWeight(node, index, tensor, ops, tuple(sources))


def _fold_chains(graph: gs.Graph, wanted: list[tuple[str, int, str]]) -> list[FoldedWeight]:
    """Folds the wanted weights into initializers in place; one record per (node, input)."""
    tensors = graph.tensors()
    chains = {name: _ancestors(tensors[name]) for _, _, name in wanted}
    values = _evaluate(graph, chains)
    order = {id(n): i for i, n in enumerate(graph.nodes)}
    records = [_chain_record(node, index, name, chains[name], order) for node, index, name in wanted]
    for record in records:
        if record.tensor not in values:
            chain = sorted(chains[record.tensor], key=lambda n: order[id(n)])
            raise ModelError(
                f"Input {record.input_index} ({record.tensor!r}) of node {record.node!r} is a weight "
                f"computed from constants by {', '.join(f'{n.op} node {n.name!r}' for n in chain)}, and "
                "ONNX Runtime could not evaluate it. Export the model with this weight as an initializer.")
    for name, array in values.items():
        tensors[name].to_constant(array)
        tensors[name].inputs.clear()
    return records


def fold_weights(model: onnx.ModelProto) -> tuple[onnx.ModelProto, tuple[FoldedWeight, ...]]:
    """Folds every weight constants compute into an initializer, and drops graph inputs that shadow one.

    Only the nodes computing weights are evaluated; other constant subgraphs (shape computations
    included) stay as they are, and nodes left without readers are removed. Unnamed nodes are named
    as :func:`~quantdbg.model.names.name_nodes` names them.

    Args:
        model: An FP32 model with topologically sorted nodes; never modified.

    Returns:
        ``model`` itself and ``()`` when nothing needs folding (a clean export), else a new model
        and one record per (weighted node, input) that was folded or read a dropped graph input,
        in graph order.

    Raises:
        ModelError: A weight's chain could not be evaluated (the node, the input and the ops are named).
    """
    computable = constant_tensors(model)
    inits = {init.name for init in model.graph.initializer}
    shadowing = {vi.name for vi in model.graph.input if vi.name in inits}
    if not shadowing and not _needs_folding(model, computable):
        return model, ()
    graph = name_graph_nodes(to_graph(model))
    wanted = _weight_inputs(graph, computable)
    records = {(r.node, r.input_index): r for r in _fold_chains(graph, wanted)} if wanted else {}
    if shadowing:
        graph.inputs = [t for t in graph.inputs if t.name not in shadowing]
        records.update({(node.name, index): FoldedWeight(node.name, index, tensor.name, ())
                        for node in graph.nodes if node.op in WEIGHTED_OPS
                        for index, tensor in enumerate(node.inputs[:2]) if tensor.name in shadowing})
    position = {node.name: i for i, node in enumerate(graph.nodes)}
    folded = to_model(graph, like=model)
    folded.ir_version = max(folded.ir_version, 4)  # from IR 4 on, initializers need not be graph inputs
    return folded, tuple(sorted(records.values(), key=lambda r: (position[r.node], r.input_index)))


def corrupt_values(values: np.ndarray, axis: int | None = None) -> str | None:
    """What makes ``values`` unfit for INT8: NaN/Inf, or values beyond float16's range that would
    round the rest of their channel (along ``axis``; None: of the whole tensor) to 0
    (:func:`~quantdbg.quant_math.outliers_zero_the_rest`). A tensor that is merely large passes: INT8
    does not care about scale.

    Returns:
        A description (``"3e+38, beyond float16's range and ..."``), or None when the values are fit.
    """
    values = np.asarray(values)
    finite = np.isfinite(values)
    if not finite.all():
        return f"{int(np.count_nonzero(~finite))} NaN/Inf value(s)"
    amax = channel_amax(values, axis)
    if values.size == 0 or float(amax.max()) <= FP16_MAX:
        return None
    ordinary, beyond = fp16_split(values, axis)
    slices = 1 if axis is None or values.ndim == 0 else values.shape[axis % values.ndim]
    lost = outliers_zero_the_rest(amax, ordinary, beyond, values.size // slices - beyond)
    if not lost.any():
        return None
    worst = int(np.argmax(np.where(lost, amax, -1.0)))
    rest = "of its channel" if axis is not None else "of its values"
    return (f"{float(amax.flat[worst]):.3g}, beyond float16's range and more than {ZEROING_FACTOR} times the "
            f"rest {rest} (at most {float(ordinary.flat[worst]):.3g}), which its INT8 scale would round to 0")


def check_weight(values: np.ndarray, tensor: str, node: str, axis: int | None = None) -> None:
    """Refuses a weight :func:`corrupt_values` finds unfit for INT8.

    Args:
        values: The weight's values.
        tensor: Its name.
        node: The node reading it.
        axis: Its per-channel axis (None: quantized per tensor).

    Raises:
        ModelError: Naming the weight, the node and what is wrong.
    """
    problem = corrupt_values(values, axis)
    if problem is not None:
        raise ModelError(f"Weight {tensor!r} of node {node!r} holds {problem}. Fix the model's weights "
                         "(re-export it) before quantizing.")


def computed_constants(model: onnx.ModelProto, names: Iterable[str]) -> dict[str, np.ndarray]:
    """Values of the tensors among ``names`` that constants alone compute through other nodes.

    Initializers and Constant outputs are left to the caller (it reads them directly); what no
    node chain computes from constants, or what could not be evaluated, is left out.

    Args:
        model: Any model (Q/DQ models included) with uniquely named, topologically sorted nodes;
            never modified.
        names: Tensor names.

    Returns:
        Tensor name -> values.
    """
    computable = constant_tensors(model)
    wanted = [name for name in dict.fromkeys(names) if name in computable]
    if not wanted:
        return {}
    graph = to_graph(model)
    tensors = graph.tensors()
    chains = {name: _ancestors(tensors[name]) for name in wanted
              if not isinstance(tensors[name], gs.Constant)}
    return _evaluate(graph, chains) if chains else {}
