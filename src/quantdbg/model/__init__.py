"""The model stage: load and validate ONNX models, find their weights, name their nodes, save them.

* :mod:`~quantdbg.model.load`: :func:`load_model` / :func:`as_loaded` (checker, shape inference,
  opset >= 13, external data, already-quantized input refused), :class:`LoadedModel`, and the data
  files a model file names (:func:`data_files_of`);
* :mod:`~quantdbg.model.weights`: weight discovery -- every input of a weighted op that constants
  alone compute is folded into an initializer on the loaded copy and recorded (:class:`FoldedWeight`);
* :mod:`~quantdbg.model.names`: node naming and fresh names;
* :mod:`~quantdbg.model.graph`: the only ModelProto <-> onnx-graphsurgeon boundary;
* :mod:`~quantdbg.model.specs`: graph input and output specs;
* :mod:`~quantdbg.model.external`: weights kept in their data file, read on demand;
* :mod:`~quantdbg.model.staging`: ONNX Runtime sessions and the checker without >2 GB messages;
* :mod:`~quantdbg.model.save`: atomic saving, with a data file for large models (:class:`SaveConfig`,
  :func:`data_path`);
* :mod:`~quantdbg.model.footprint`: a run's model weight bytes and peak memory (:class:`Footprint`).
"""
from quantdbg._exports import public_names as _public_names
from quantdbg.model.external import fits_in_protobuf as fits_in_protobuf
from quantdbg.model.external import is_external as is_external
from quantdbg.model.external import model_bytes as model_bytes
from quantdbg.model.external import tensor_array as tensor_array
from quantdbg.model.external import tensor_nbytes as tensor_nbytes
from quantdbg.model.external import weight_bytes as weight_bytes
from quantdbg.model.footprint import Footprint as Footprint
from quantdbg.model.footprint import footprint as footprint
from quantdbg.model.graph import constant_values as constant_values
from quantdbg.model.graph import to_graph as to_graph
from quantdbg.model.graph import to_model as to_model
from quantdbg.model.load import MIN_OPSET as MIN_OPSET
from quantdbg.model.load import QUANTIZED_OP_TYPES as QUANTIZED_OP_TYPES
from quantdbg.model.load import LoadedModel as LoadedModel
from quantdbg.model.load import ModelSource as ModelSource
from quantdbg.model.load import as_loaded as as_loaded
from quantdbg.model.load import data_files_of as data_files_of
from quantdbg.model.load import load_model as load_model
from quantdbg.model.load import opset_of as opset_of
from quantdbg.model.load import quantized_nodes as quantized_nodes
from quantdbg.model.names import UniqueNames as UniqueNames
from quantdbg.model.names import check_node_globs as check_node_globs
from quantdbg.model.names import name_graph_nodes as name_graph_nodes
from quantdbg.model.names import name_nodes as name_nodes
from quantdbg.model.names import node_names as node_names
from quantdbg.model.save import SaveConfig as SaveConfig
from quantdbg.model.save import data_path as data_path
from quantdbg.model.save import save_model as save_model
from quantdbg.model.specs import TensorSpec as TensorSpec
from quantdbg.model.specs import input_specs as input_specs
from quantdbg.model.specs import output_specs as output_specs
from quantdbg.model.staging import StagedModel as StagedModel
from quantdbg.model.staging import check_model as check_model
from quantdbg.model.staging import staged as staged
from quantdbg.model.weights import WEIGHTED_OPS as WEIGHTED_OPS
from quantdbg.model.weights import FoldedWeight as FoldedWeight
from quantdbg.model.weights import check_weight as check_weight
from quantdbg.model.weights import computed_constants as computed_constants
from quantdbg.model.weights import constant_tensors as constant_tensors
from quantdbg.model.weights import corrupt_values as corrupt_values
from quantdbg.model.weights import fold_weights as fold_weights
from quantdbg.model.weights import summarize_folded as summarize_folded

__all__ = _public_names(globals())
