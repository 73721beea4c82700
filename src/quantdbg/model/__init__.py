"""The model stage: load and validate ONNX models, find their weights, name their nodes, save them.

* :mod:`~quantdbg.model.load`: :func:`load_model` / :func:`as_loaded` (checker, shape inference,
  opset >= 13, external data, already-quantized input refused) and :class:`LoadedModel`;
* :mod:`~quantdbg.model.weights`: weight discovery -- every input of a weighted op that constants
  alone compute is folded into an initializer on the loaded copy and recorded (:class:`FoldedWeight`);
* :mod:`~quantdbg.model.names`: node naming and fresh names;
* :mod:`~quantdbg.model.graph`: the only ModelProto <-> onnx-graphsurgeon boundary;
* :mod:`~quantdbg.model.specs`: graph input and output specs;
* :mod:`~quantdbg.model.save`: atomic saving.
"""
from quantdbg._exports import public_names as _public_names
from quantdbg.model.graph import constant_values, to_graph, to_model
from quantdbg.model.load import (
    MIN_OPSET,
    QUANTIZED_OP_TYPES,
    LoadedModel,
    ModelSource,
    as_loaded,
    fits_in_protobuf,
    load_model,
    opset_of,
    quantized_nodes,
)
from quantdbg.model.names import UniqueNames, check_node_globs, name_graph_nodes, name_nodes, node_names
from quantdbg.model.save import save_model
from quantdbg.model.specs import TensorSpec, input_specs, output_specs
from quantdbg.model.weights import (
    WEIGHTED_OPS,
    FoldedWeight,
    computed_constants,
    constant_tensors,
    fold_weights,
    summarize_folded,
)

__all__ = _public_names(globals())
