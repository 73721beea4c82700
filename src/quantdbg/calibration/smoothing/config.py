"""What to smooth and how hard: :class:`SmoothingConfig`."""
from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from typing import Literal, get_args

from quantdbg import _json
from quantdbg.errors import ConfigError

SmoothOp = Literal["MatMul", "Gemm"]
"""Op types smoothing rewrites: input 0 is the activation, input 1 an initializer weight."""


@dataclass(frozen=True)
class SmoothingConfig(_json.Serializable):
    """What to smooth and how hard.

    Attributes:
        alpha: Migration strength in [0, 1]: at 1, ``s_j = max|X_j|`` flattens every activation
            channel to max 1 and the weights take the whole range; at 0, ``s_j = 1/max|W_j|``
            flattens the weight rows instead. 0.5 is SmoothQuant's default; when the weights have
            outlier rows of their own (``Migration.weight_outlier_before`` above
            ``act_outlier_before``), a larger alpha keeps them out of the activations -- with
            per-channel weight scales, MiniLM-L6 did best at 0.8-0.9 (benchmarks/RESULTS.md).
        op_types: Op types to smooth; their input 0 is the activation, input 1 an initializer
            weight (Gemm with ``transA=0``).
        nodes: Node-name globs to smooth (default: every node of ``op_types``).
        exclude: Node-name globs never smoothed (wins over ``nodes``).
        fold: Fold ``1/s`` into a preceding LayerNormalization, Mul/Div constant or MatMul where
            legal; False always inserts an explicit Mul.
        max_scale: ``s`` is clipped to ``[1/max_scale, max_scale]`` so a near-empty channel
            cannot blow a weight row up.
        max_batches: Use at most this many calibration feeds (None: all).
    """

    alpha: float = 0.5
    op_types: tuple[SmoothOp, ...] = ("MatMul", "Gemm")
    nodes: tuple[str, ...] = ("*",)
    exclude: tuple[str, ...] = ()
    fold: bool = True
    max_scale: float = 1e4
    max_batches: int | None = None

    def __post_init__(self) -> None:
        for name in ("op_types", "nodes", "exclude"):
            value = getattr(self, name)
            if isinstance(value, str):
                raise ConfigError(f"SmoothingConfig.{name} takes a sequence of strings, not one string "
                                  f"({value!r}); write ({value!r},).")
            object.__setattr__(self, name, tuple(value))
        if not 0.0 <= self.alpha <= 1.0:
            raise ConfigError(f"SmoothingConfig.alpha must be in [0, 1], got {self.alpha}.")
        bad = [op for op in self.op_types if op not in get_args(SmoothOp)]
        if bad or not self.op_types:
            raise ConfigError(f"SmoothingConfig.op_types must be a non-empty subset of {get_args(SmoothOp)}, "
                              f"got {self.op_types}.")
        if not self.nodes:
            raise ConfigError("SmoothingConfig.nodes is empty: nothing would be smoothed; use ('*',).")
        if not self.max_scale >= 1.0:
            raise ConfigError(f"SmoothingConfig.max_scale must be >= 1, got {self.max_scale}.")
        if self.max_batches is not None and self.max_batches < 1:
            raise ConfigError(f"SmoothingConfig.max_batches must be >= 1 or None, got {self.max_batches}.")

    def selects(self, node_name: str) -> bool:
        """True when ``node_name`` matches ``nodes`` and no ``exclude`` glob."""
        match = any(fnmatch.fnmatchcase(node_name, p) for p in self.nodes)
        return match and not any(fnmatch.fnmatchcase(node_name, p) for p in self.exclude)


DEFAULT_SMOOTHING = SmoothingConfig()
