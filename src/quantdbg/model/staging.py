"""Handing a model to ONNX Runtime and to onnx's checker without a >2 GB message or a weight copy.

A model whose weights stay in their data file (:mod:`quantdbg.model.external`) is staged as its
graph alone, a few kilobytes, with ONNX Runtime told which folder the data file is in; the
session then reads (or maps) the weights from the original file. Only a model holding more than
2 GB in memory is written out to a temporary folder first.
"""
from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import onnx

from quantdbg.model.external import (
    BASE_KEY,
    all_tensors,
    external_bases,
    fits_in_protobuf,
    is_external,
    strip_bases,
)
from quantdbg.model.save import write_external

EXTERNAL_FOLDER_KEY = "session.model_external_initializers_file_folder_path"
"""ONNX Runtime's session option: the folder external data is relative to, for a model given as bytes."""


@dataclass(frozen=True)
class StagedModel:
    """What an ``onnxruntime.InferenceSession`` is built from.

    Attributes:
        source: The serialised graph (bytes) or the path of a staged ``.onnx`` file.
        folder: The folder of the weights' data file for a bytes source, else None.
    """

    source: str | bytes
    folder: str | None = None

    def configure(self, options: Any) -> Any:
        """Adds what the session needs to find the weights to ``onnxruntime.SessionOptions``."""
        if self.folder is not None:
            options.add_session_config_entry(EXTERNAL_FOLDER_KEY, self.folder)
        return options


@contextlib.contextmanager
def staged(model: onnx.ModelProto) -> Iterator[StagedModel]:
    """Yields ``model`` in the form a session is built from; build the session inside the block.

    Temporary files (only for a model holding more than 2 GB in memory, or reading data files from
    several folders) are removed on exit; ONNX Runtime has read its weights by then.
    """
    bases = external_bases(model)
    if len(bases) <= 1 and fits_in_protobuf(model):
        if not bases:
            yield StagedModel(model.SerializeToString())
            return
        graph = onnx.ModelProto()
        graph.CopyFrom(model)  # the weights are external: this copies the graph only
        strip_bases(graph)
        yield StagedModel(graph.SerializeToString(), bases.pop())
        return
    with tempfile.TemporaryDirectory(prefix="quantdbg-stage-") as tmp:
        path = Path(tmp) / "model.onnx"
        write_external(model, path, "model.onnx.data")
        yield StagedModel(str(path))


def check_model(model: onnx.ModelProto) -> None:
    """Runs onnx's checker on ``model``, by path when it has external data or exceeds 2 GB.

    Raises:
        onnx.checker.ValidationError: The checker's verdict.
    """
    bases = external_bases(model)
    if not bases and fits_in_protobuf(model):
        onnx.checker.check_model(model)
        return
    with tempfile.TemporaryDirectory(prefix="quantdbg-check-") as tmp:
        path = Path(tmp) / "model.onnx"
        if len(bases) <= 1 and fits_in_protobuf(model):
            _stand_in_data(model, Path(tmp))
            graph = onnx.ModelProto()
            graph.CopyFrom(model)
            strip_bases(graph)
            onnx.save(graph, str(path))
        else:
            write_external(model, path, "model.onnx.data")
        onnx.checker.check_model(str(path))


def _stand_in_data(model: onnx.ModelProto, folder: Path) -> None:
    """Creates, in ``folder``, sparse files the size of the data files ``model`` reads from.

    The checker looks at the graph and at where each tensor's bytes are (the file exists, is a
    regular file, is long enough), never at the values; a sparse file answers that without copying
    the weights, and a symbolic link to the original is refused by the checker.
    """
    for tensor in all_tensors(model):
        if not is_external(tensor):
            continue
        info = {entry.key: entry.value for entry in tensor.external_data}
        stand_in = folder / info["location"]
        if stand_in.exists():
            continue
        stand_in.parent.mkdir(parents=True, exist_ok=True)
        with open(stand_in, "wb") as handle:
            handle.truncate(os.path.getsize(Path(info[BASE_KEY]) / info["location"]))
