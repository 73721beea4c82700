"""A detector-like model whose culprit layers the local ranking puts last.

Two branches read the same input ``x[N, 16]``:

* a box branch, ``box0 .. box{B-1}`` (MatMul -> Relu, the last without Relu) -> ``boxes``;
* a class head, ``cls0`` (MatMul -> Relu) -> ``cls1`` (MatMul) -> Sigmoid -> ``scores[N, 4]``.

The task metric is the agreement of the thresholded class decisions (``scores > 0.5``) with FP32's;
boxes do not enter it. The data mixes a few large samples with many small ones, so a min/max range
(set by the large ones) is coarse for the small ones: the head's own output error is small overall
(high local SQNR, dominated by the large samples), yet the small samples' logits, near the
threshold, flip. The box branch gets ranges ``BOX_AMAX_FACTOR`` times too wide: a large local
error that changes no decision. So local mode ranks the box layers first and the head last, while
exactly the head (``CULPRITS``) must leave INT8 for the decisions to agree.
"""
from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs
from models import _const, _finish, _rng
from models_sensitivity import quantize_by_hand

from quantdbg.evaluation import OutputFunction
from quantdbg.qdq import QuantizedModel

WIDTH = 16
CLASSES = 4
CULPRITS = ("cls0", "cls1")
BOX_AMAX_FACTOR = 6.0


def detector(n_box: int = 8, seed: int = 0) -> onnx.ModelProto:
    """The model (``n_box`` box layers + the two head layers)."""
    rng = _rng(seed)
    x = gs.Variable("x", np.float32, ("N", WIDTH))
    bx = gs.Variable("bx", np.float32)
    nodes = [gs.Node("Relu", "box_in", inputs=[x], outputs=[bx])]
    current = bx
    for i in range(n_box):
        out = gs.Variable(f"box{i}_out", np.float32)
        weight = _const(f"box{i}.w", (WIDTH, WIDTH), rng, 0.35)
        nodes.append(gs.Node("MatMul", f"box{i}", inputs=[current, weight], outputs=[out]))
        current = out
        if i < n_box - 1:
            act = gs.Variable(f"box{i}_act", np.float32)
            nodes.append(gs.Node("Relu", f"box{i}_relu", inputs=[out], outputs=[act]))
            current = act
    boxes = gs.Variable("boxes", np.float32, ("N", WIDTH))
    nodes[-1].outputs = [boxes]
    h, hr, logits = (gs.Variable(n, np.float32) for n in ("cls0_out", "cls0_act", "logits"))
    scores = gs.Variable("scores", np.float32, ("N", CLASSES))
    nodes += [gs.Node("MatMul", "cls0", inputs=[x, _const("cls0.w", (WIDTH, WIDTH), rng, 0.35)], outputs=[h]),
              gs.Node("Relu", "cls0_relu", inputs=[h], outputs=[hr]),
              gs.Node("MatMul", "cls1", inputs=[hr, _const("cls1.w", (WIDTH, CLASSES), rng, 0.35)],
                      outputs=[logits]),
              gs.Node("Sigmoid", "sigmoid", inputs=[logits], outputs=[scores])]
    return _finish(gs.Graph(nodes, [x], [boxes, scores], name="detector"))


def feeds(rng: np.random.Generator, batches: int = 4, batch: int = 16) -> list[dict[str, np.ndarray]]:
    """Batches where one sample in eight is large (scale 1) and the rest small (scale 0.05)."""
    out = []
    for _ in range(batches):
        scale = np.where(np.arange(batch) % 8 == 0, 1.0, 0.05)[:, None]
        out.append({"x": (rng.standard_normal((batch, WIDTH)) * scale).astype(np.float32)})
    return out


def quantized(model: onnx.ModelProto, data: list[dict[str, np.ndarray]]) -> QuantizedModel:
    """Min/max ranges, the box branch's ``BOX_AMAX_FACTOR`` times too wide."""
    box_inputs = [node.inputs[0].name for node in gs.import_onnx(model).nodes
                  if node.op == "MatMul" and node.name.startswith("box")]
    return quantize_by_hand(model, data, {name: BOX_AMAX_FACTOR for name in box_inputs})


def _agreement(outputs, reference) -> float:
    return float(np.mean((outputs["scores"] > 0.5) == (reference["scores"] > 0.5)))


DECISIONS = OutputFunction(_agreement, "decision_agreement")
"""Share of (sample, class) decisions at the 0.5 confidence cut that agree with FP32."""
