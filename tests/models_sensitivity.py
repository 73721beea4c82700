"""Models and hand-made quantization for the sensitivity / fallback tests.

``quantize_by_hand`` computes exact min/max ranges with NumPy over the feeds (the FP32 model run
with every planned activation exposed) and inserts Q/DQ through quantdbg.qdq, so these tests do not
depend on the calibration pipeline; ``amax_factor`` scales chosen ranges to plant a bad layer.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import onnxruntime as ort
from models import _const, _finish, _rng

from quantdbg.calibration import CalibrationResult, TensorRange
from quantdbg.cli import main
from quantdbg.model import load_model
from quantdbg.model.names import name_nodes
from quantdbg.placement import plan_qdq
from quantdbg.qdq import QuantizedModel, insert_qdq


def mlp4(seed: int = 0, width: int = 16) -> onnx.ModelProto:
    """x[N,16] -> 4 x (MatMul -> Relu) with the last Relu dropped: four quantizable layers."""
    rng = _rng(seed)
    x = gs.Variable("x", np.float32, ("N", width))
    nodes, current = [], x
    for i in range(4):
        out = gs.Variable(f"mm{i}", np.float32)
        weight = _const(f"fc{i}.w", (width, width), rng, 0.4)
        nodes.append(gs.Node("MatMul", f"fc{i}", inputs=[current, weight], outputs=[out]))
        current = out
        if i < 3:
            act = gs.Variable(f"act{i}", np.float32)
            nodes.append(gs.Node("Relu", f"relu{i}", inputs=[current], outputs=[act]))
            current = act
    y = gs.Variable("y", np.float32, ("N", width))
    nodes[-1].outputs = [y]
    return _finish(gs.Graph(nodes, [x], [y], name="mlp4"))


def small_cnn(seed: int = 0) -> onnx.ModelProto:
    """x[N,3,8,8] -> conv1 -> relu -> conv2 -> relu -> conv3 -> GlobalAveragePool -> Flatten -> fc."""
    rng = _rng(seed)
    x = gs.Variable("x", np.float32, ("N", 3, 8, 8))
    names = ("c1", "r1", "c2", "r2", "c3", "pool", "flat")
    c1, r1, c2, r2, c3, pool, flat = (gs.Variable(n, np.float32) for n in names)
    y = gs.Variable("y", np.float32, ("N", 10))
    pads = {"pads": [1, 1, 1, 1]}
    nodes = [
        gs.Node("Conv", "conv1", pads, inputs=[x, _const("conv1.w", (8, 3, 3, 3), rng)], outputs=[c1]),
        gs.Node("Relu", "relu1", inputs=[c1], outputs=[r1]),
        gs.Node("Conv", "conv2", pads, inputs=[r1, _const("conv2.w", (8, 8, 3, 3), rng, 0.2)], outputs=[c2]),
        gs.Node("Relu", "relu2", inputs=[c2], outputs=[r2]),
        gs.Node("Conv", "conv3", pads, inputs=[r2, _const("conv3.w", (8, 8, 3, 3), rng, 0.2)], outputs=[c3]),
        gs.Node("GlobalAveragePool", "gap", inputs=[c3], outputs=[pool]),
        gs.Node("Flatten", "flatten", {"axis": 1}, inputs=[pool], outputs=[flat]),
        gs.Node("Gemm", "fc", {"transB": 1}, inputs=[flat, _const("fc.w", (10, 8), rng, 0.5)], outputs=[y]),
    ]
    return _finish(gs.Graph(nodes, [x], [y], name="small_cnn"))


def run_exposed(model: onnx.ModelProto, feeds: Sequence[Mapping[str, np.ndarray]],
                tensors: Sequence[str]) -> dict[str, list[np.ndarray]]:
    """Runs ``model`` in ONNX Runtime with ``tensors`` exposed; returns each tensor per batch."""
    exposed = onnx.ModelProto()
    exposed.CopyFrom(model)
    present = {o.name for o in exposed.graph.output}
    exposed.graph.output.extend(onnx.helper.make_tensor_value_info(t, onnx.TensorProto.FLOAT, None)
                                for t in tensors if t not in present)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(exposed.SerializeToString(), options, providers=["CPUExecutionProvider"])
    values: dict[str, list[np.ndarray]] = {t: [] for t in tensors}
    for feed in feeds:
        for name, value in zip(tensors, session.run(list(tensors), dict(feed)), strict=True):
            values[name].append(value)
    return values


def quantize_by_hand(model: onnx.ModelProto, feeds: Sequence[Mapping[str, np.ndarray]],
                     amax_factor: Mapping[str, float] | None = None) -> QuantizedModel:
    """Min/max-calibrated Q/DQ model; ``amax_factor`` multiplies the range of named tensors."""
    fp = name_nodes(load_model(model))
    plan = plan_qdq(fp)
    tensors = plan.activation_tensors
    exposed = run_exposed(fp, feeds, tensors)
    ranges = {}
    for name in tensors:
        amax = max(float(np.abs(v).max()) for v in exposed[name]) * (amax_factor or {}).get(name, 1.0)
        ranges[name] = TensorRange(name, -amax, amax, "minmax")
    return insert_qdq(fp, CalibrationResult(ranges, {}), plan=plan)


def feeds_for(model: onnx.ModelProto, rng: np.random.Generator, batches: int = 3,
              batch: int = 4) -> list[dict[str, np.ndarray]]:
    """Random standard-normal feeds for a single-input float model."""
    (inp,) = [i for i in model.graph.input]
    dims = [d.dim_value for d in inp.type.tensor_type.shape.dim][1:]
    return [{inp.name: rng.standard_normal((batch, *dims)).astype(np.float32)} for _ in range(batches)]


def write_mlp4_pair(folder, qdq_name: str = "q.onnx") -> np.ndarray:
    """Writes :func:`mlp4` as ``folder/m.onnx`` and its hand-quantized Q/DQ form (``act1`` clipped
    at 0.01) as ``folder/qdq_name``, for CLI tests; returns the samples of its three batches."""
    model = mlp4()
    feeds = feeds_for(model, np.random.default_rng(0))
    onnx.save(model, str(folder / "m.onnx"))
    quantize_by_hand(model, feeds, {"act1": 0.01}).save(folder / qdq_name)
    return np.concatenate([f["x"] for f in feeds])


def write_cli_folder(folder):
    """:func:`write_mlp4_pair` in ``folder``, its samples as ``calib.npz`` and ``eval.npz``, and the
    Q/DQ model's sensitivity result as ``r.json`` (``quantdbg analyze``); returns ``folder``."""
    x = write_mlp4_pair(folder)
    np.savez(folder / "calib.npz", x=x)
    np.savez(folder / "eval.npz", x=x)
    assert main(["analyze", str(folder / "q.onnx"), "--fp32", str(folder / "m.onnx"), "--eval",
                 str(folder / "eval.npz"), "--no-evidence", "--out", str(folder / "r.json")]) == 0
    return folder
