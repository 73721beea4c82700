"""Large generated models: a stack of MatMuls whose weights go straight to an external data file.

The weights are drawn from a seeded RNG and written one layer at a time, so generating a model of
any size holds one layer in memory, never the whole model (nor a >2 GB protobuf message).
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper


def matmul_stack(folder: Path, weight_bytes: int, width: int = 2048, seed: int = 0,
                 name: str = "model.onnx") -> Path:
    """Writes ``folder/name`` + ``folder/name.data``: MatMul (+ Relu) layers of ``width`` x ``width``.

    Enough layers to hold at least ``weight_bytes`` of float32 weights. He-scaled weights keep the
    activations' scale from layer to layer, so every layer quantizes alike.

    Returns:
        The model's path.
    """
    layers = max(1, math.ceil(weight_bytes / (width * width * 4)))
    rng = np.random.default_rng(seed)
    location = name + ".data"
    inits, nodes, prev = [], [], "x"
    with open(folder / location, "wb") as data:
        for i in range(layers):
            weight = rng.standard_normal((width, width), dtype=np.float32)
            weight *= np.float32(math.sqrt(2.0 / width))
            inits.append(_external(f"w{i}", weight.shape, location, data.tell(), weight.nbytes))
            data.write(weight.tobytes())
            nodes.append(helper.make_node("MatMul", [prev, f"w{i}"], [f"mm{i}_out"], name=f"mm{i}"))
            prev = f"mm{i}_out"
            if i < layers - 1:
                nodes.append(helper.make_node("Relu", [prev], [f"relu{i}_out"], name=f"relu{i}"))
                prev = f"relu{i}_out"
    graph = helper.make_graph(nodes, "matmul_stack",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", width])],
                              [helper.make_tensor_value_info(prev, TensorProto.FLOAT, ["N", width])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = folder / name
    path.write_bytes(model.SerializeToString())  # the graph alone: the weights are already on disk
    return path


def _external(name: str, shape: tuple[int, ...], location: str, offset: int, length: int) -> TensorProto:
    tensor = TensorProto(name=name, data_type=TensorProto.FLOAT, dims=list(shape))
    tensor.data_location = TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", str(offset)), ("length", str(length))):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value
    return tensor


def inputs(width: int, n: int, seed: int = 1) -> np.ndarray:
    """``n`` samples for the stack's input ``x``."""
    return np.random.default_rng(seed).standard_normal((n, width), dtype=np.float32)


def checked(path: Path) -> onnx.ModelProto:
    """``path`` checked by path (the data file included) and loaded with its weights."""
    onnx.checker.check_model(str(path))
    return onnx.load(str(path))
