"""Writing a model atomically, with its weights beside it past protobuf's 2 GB."""
from __future__ import annotations

import os
from pathlib import Path

import onnx
from onnx import external_data_helper

from quantdbg._io import write_bytes_atomic
from quantdbg.errors import ModelError
from quantdbg.model.load import fits_in_protobuf


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
