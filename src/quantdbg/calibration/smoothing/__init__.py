"""SmoothQuant-style migration of activation outliers into weights (Xiao et al., 2023).

A MatMul ``Y = X @ W`` equals ``(X / s) @ (s * W)`` for any positive per-input-channel vector
``s`` (``W``'s rows scaled by ``s``). Choosing ``s_j = max|X_j|^alpha / max|W_j|^(1 - alpha)``
flattens the activation channels that carry outliers (GELU outputs, LayerNorm outputs) at the
price of wider weight rows; weights are quantized per output channel, so they absorb it far better
than a per-tensor activation scale does. The FP32 function is unchanged.

``1/s`` goes where it costs nothing when the graph allows it: into the gamma/beta of a preceding
LayerNormalization, the constant of a preceding Mul/Div, or the columns (and bias) of a preceding
MatMul -- legal only when every reader of the activation is smoothed with the same ``s`` (shape
readers aside). Otherwise an explicit ``Mul`` by ``1/s`` is inserted in front of the smoothed
nodes only. The Q/DQ pair then lands on the Mul's output, so the Mul runs in FP16/FP32 just
before a QuantizeLinear; TensorRT's pointwise fusion can merge the two (or the Mul into its
producer), and at worst it is one cheap elementwise kernel.

Modules, in the order the data flows: ``config`` (:class:`SmoothingConfig`), ``measure``
(per-channel max |x| in one ONNX Runtime pass), ``plan`` (which nodes share one ``s``),
``fold`` (``1/s`` into a producer) and ``migrate`` (the factors and the rewrite), ``result``
(what was done), ``apply`` (the entry points).

Typical use::

    result = smooth(model, "calib.npz", SmoothingConfig(alpha=0.8))
    qmodel = quantdbg.quantize(result.model, "calib.npz", CalibConfig("minmax"))
"""
from quantdbg.calibration.smoothing.apply import apply_smoothing, smooth
from quantdbg.calibration.smoothing.config import SmoothingConfig
from quantdbg.calibration.smoothing.measure import collect_channel_absmax
from quantdbg.calibration.smoothing.result import Migration, SkippedNode, SmoothingResult

__all__ = [
    "Migration", "SkippedNode", "SmoothingConfig", "SmoothingResult", "apply_smoothing",
    "collect_channel_absmax", "smooth",
]
