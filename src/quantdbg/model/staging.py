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
    inline_bytes,
    is_external,
    strip_bases,
    weight_bytes,
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
        large: The model's weights (in memory or in their data file) reach :data:`SPILL_BYTES`.
    """

    source: str | bytes
    folder: str | None = None
    large: bool = False

    def configure(self, options: Any) -> Any:
        """Adds what the session needs to find the weights to ``onnxruntime.SessionOptions``.

        A model with large weights (in memory, or in its data file) also gets ONNX Runtime's CPU
        arena turned off: the arena keeps the largest run's allocations (e.g. If nodes that output
        a weight copy it) for the session's life, which for such a model is a copy of its weights.
        Its nodes also run in priority-based order: the default order runs every node that reads
        only weights and graph inputs (the switch graph's If nodes) before the first layer, so
        every selected weight's copy would be alive at once. The order changes no value.
        """
        if self.folder is not None:
            options.add_session_config_entry(EXTERNAL_FOLDER_KEY, self.folder)
        if self.large:
            options.enable_cpu_mem_arena = False
            options.execution_order = _ort().ExecutionOrder.PRIORITY_BASED
        return options


@contextlib.contextmanager
def staged(model: onnx.ModelProto) -> Iterator[StagedModel]:
    """Yields ``model`` in the form a session is built from; build the session inside the block.

    A model holding less than :data:`SPILL_BYTES` in memory goes as bytes. A larger one (e.g. a
    sensitivity graph with fake-quantized weights) is written to a temporary folder, its in-memory
    tensors to a data file there, so neither a >2 GB message nor serialised copies of them are
    made; the data files it already reads from are hard-linked beside it (copied, tensor by
    tensor, only when a link is impossible). The folder is removed on exit: ONNX Runtime has read
    or mapped the weights by then.
    """
    bases = external_bases(model)
    if len(bases) <= 1 and inline_bytes(model) < SPILL_BYTES:
        if not bases:
            yield StagedModel(model.SerializeToString())
            return
        graph = onnx.ModelProto()
        graph.CopyFrom(model)  # the large weights are external: this copies the graph only
        strip_bases(graph)
        yield StagedModel(graph.SerializeToString(), bases.pop(), large=weight_bytes(model) >= SPILL_BYTES)
        return
    with tempfile.TemporaryDirectory(prefix="quantdbg-stage-") as tmp:
        path = Path(tmp) / "model.onnx"
        linked = _link_data_files(model, Path(tmp))
        write_external(model, path, _STAGED_DATA, copy_external=not linked)
        yield StagedModel(str(path), large=True)


SPILL_BYTES = 128 * 2**20
"""In-memory tensor bytes above which a session's model is staged as files rather than bytes."""
_STAGED_DATA = "quantdbg_staged.data"


def _link_data_files(model: onnx.ModelProto, folder: Path) -> bool:
    """Hard-links the data files ``model`` reads into ``folder``; False when one cannot be linked
    (another file system, or two folders' files of one name)."""
    sources: dict[str, Path] = {}
    for tensor in all_tensors(model):
        if is_external(tensor):
            info = {entry.key: entry.value for entry in tensor.external_data}
            source = Path(info.get(BASE_KEY, "")) / info["location"]
            if sources.setdefault(info["location"], source) != source or info["location"] == _STAGED_DATA:
                return False
    try:
        for location, source in sources.items():
            (folder / location).parent.mkdir(parents=True, exist_ok=True)
            os.link(source, folder / location)
    except OSError:
        for location in sources:
            (folder / location).unlink(missing_ok=True)
        return False
    return True


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


def _ort() -> Any:
    import onnxruntime  # imported on use, as the backends do: loading a model needs no ONNX Runtime

    return onnxruntime
