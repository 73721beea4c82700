"""Node names: layers are identified by node name throughout quantdbg, so every node gets a unique one,
and fresh names for inserted nodes never collide with the model's."""
from __future__ import annotations

import difflib
import fnmatch
from collections.abc import Iterable, Sequence

import onnx
import onnx_graphsurgeon as gs

from quantdbg.errors import ModelError, unknown


def name_nodes(model: onnx.ModelProto) -> onnx.ModelProto:
    """Gives every unnamed node a unique name ``<op_type>_<index>`` in place and returns ``model``.

    Layers are identified by node name throughout quantdbg, so a model with unnamed or
    duplicate-named nodes gets deterministic names first.
    """
    nodes = model.graph.node
    for node, name in zip(nodes, node_names((n.name, n.op_type) for n in nodes), strict=True):
        node.name = name
    return model


def name_graph_nodes(graph: gs.Graph) -> gs.Graph:
    """:func:`name_nodes` on an onnx-graphsurgeon graph (in place; nodes in their current order)."""
    names = node_names((node.name, node.op) for node in graph.nodes)
    for node, name in zip(graph.nodes, names, strict=True):
        node.name = name
    return graph


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


def check_node_globs(owner: str, patterns: Iterable[str], names: Sequence[str], kind: str = "node") -> None:
    """Checks that every name glob matches a name, so a typo is not silently ignored.

    Args:
        owner: The setting the globs come from, e.g. ``"QuantConfig.exclude"``.
        patterns: Names or ``fnmatch`` globs.
        names: The names they may match (by default the model's node names).
        kind: What ``names`` are, for the message.

    Raises:
        ModelError: A glob matches no name (close names are suggested).
    """
    for pattern in patterns:
        if not any(fnmatch.fnmatchcase(name, pattern) for name in names):
            err = str(unknown(kind, pattern, names))
            if "Did you mean" not in err:  # no name is close: show the nearest anyway
                err = (f"{err[:-1]}; the closest are {', '.join(map(repr, closest_names(pattern, names)))} "
                       f"({len(names)} in all).")
            raise ModelError(f"{owner} entry {pattern!r} matches no {kind}. {err}")


def closest_names(pattern: str, names: Sequence[str], n: int = 3) -> list[str]:
    """The ``n`` names closest to a name or glob: by whole name, else by one ``/``-separated part,
    else the first ``n`` (so a message always shows what the names look like)."""
    text = pattern.replace("*", "").replace("?", "")
    near = difflib.get_close_matches(text, list(names), n=n, cutoff=0.5)
    if not near:
        scored = sorted(((max(difflib.SequenceMatcher(None, text, part).ratio() for part in name.split("/")),
                          -i, name) for i, name in enumerate(names)), reverse=True)
        near = [name for score, _, name in scored[:n] if score >= 0.5]
    return near or list(names[:n])


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
