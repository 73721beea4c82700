"""The model stage: load and validate ONNX models, find their weights, name their nodes, save them.

* :mod:`~quantdbg.model.load`: :func:`load_model` / ``as_loaded`` (checker, shape inference,
  opset >= 13, external data, already-quantized input refused), :class:`LoadedModel`, and the data
  files a model file names (``data_files_of``);
* :mod:`~quantdbg.model.weights`: weight discovery -- every input of a weighted op that constants
  alone compute is folded into an initializer on the loaded copy and recorded (``FoldedWeight``);
* :mod:`~quantdbg.model.names`: node naming and fresh names;
* :mod:`~quantdbg.model.graph`: the only ModelProto <-> onnx-graphsurgeon boundary;
* :mod:`~quantdbg.model.specs`: graph input and output specs;
* :mod:`~quantdbg.model.external`: weights kept in their data file, read on demand;
* :mod:`~quantdbg.model.staging`: ONNX Runtime sessions and the checker without >2 GB messages;
* :mod:`~quantdbg.model.save`: atomic saving, with a data file for large models (:class:`SaveConfig`,
  ``data_path``);
* :mod:`~quantdbg.model.footprint`: a run's model weight bytes and peak memory (``Footprint``);
* :mod:`~quantdbg.model.travel`: a lazy model's data files travel with it to cluster nodes.
"""
from quantdbg.model import travel as _travel  # noqa: F401  (registers how lazy models travel)
from quantdbg.model.load import LoadedModel, load_model
from quantdbg.model.save import SaveConfig, save_model

__all__ = ["LoadedModel", "SaveConfig", "load_model", "save_model"]
