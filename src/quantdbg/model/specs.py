"""Names, element types and shapes of a model's graph inputs and outputs."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper


@dataclass(frozen=True)
class TensorSpec:
    """Name, element type and shape of a graph input or output.

    Attributes:
        name: ONNX value name.
        dtype: NumPy dtype of the elements.
        shape: One entry per axis: an int for a fixed dim, a str for a named dynamic dim, None
            for an unnamed dynamic dim.
    """

    name: str
    dtype: np.dtype
    shape: tuple[int | str | None, ...]

    @property
    def fixed_batch(self) -> int | None:
        """The size of axis 0 when it is fixed (a positive int), else None (dynamic, or a scalar)."""
        first = self.shape[0] if self.shape else None
        return first if isinstance(first, int) and first > 0 else None


def input_specs(model: onnx.ModelProto) -> dict[str, TensorSpec]:
    """Returns the graph inputs that are not initializers, in graph order."""
    inits = {init.name for init in model.graph.initializer}
    return {vi.name: _spec(vi) for vi in model.graph.input if vi.name not in inits}


def output_specs(model: onnx.ModelProto) -> dict[str, TensorSpec]:
    """Returns the graph outputs in graph order."""
    return {vi.name: _spec(vi) for vi in model.graph.output}


def _spec(vi: onnx.ValueInfoProto) -> TensorSpec:
    ttype = vi.type.tensor_type
    dtype = np.dtype(helper.tensor_dtype_to_np_dtype(ttype.elem_type))
    dims: list[int | str | None] = []
    for dim in ttype.shape.dim:
        if dim.HasField("dim_value"):
            dims.append(int(dim.dim_value))
        elif dim.HasField("dim_param"):
            dims.append(dim.dim_param)
        else:
            dims.append(None)
    return TensorSpec(vi.name, dtype, tuple(dims))
