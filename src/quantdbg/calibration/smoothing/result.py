"""What smoothing did: one :class:`Migration` per smoothed activation, the nodes it skipped, and
the smoothed model with that record (:class:`SmoothingResult`)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import onnx

from quantdbg import _json
from quantdbg.calibration.smoothing.config import SmoothingConfig
from quantdbg.errors import unknown

Placement = Literal["layernorm", "scale_constant", "bias_matmul", "matmul", "explicit_mul"]
"""Where ``1/s`` went: a LayerNormalization's gamma/beta, a Mul/Div constant, the columns and
bias of a MatMul+Add, the columns of a MatMul, or an inserted Mul."""


@dataclass(frozen=True)
class Migration(_json.Serializable):
    """One smoothing factor ``s``, shared by every node that reads one activation tensor.

    Attributes:
        nodes: The smoothed nodes (their names are unchanged in the smoothed model).
        tensor: The activation tensor they read in the original model.
        smoothed_tensor: The tensor they read in the smoothed model (``tensor`` itself when
            ``1/s`` was folded upstream, the inserted Mul's output otherwise); per-tensor
            calibrator globs must match this name.
        weights: Original names of the weight initializers whose rows were multiplied by ``s``.
        placement: Where ``1/s`` went.
        folded_into: The producer node that absorbed ``1/s``, or the name of the inserted Mul.
        channels: Number of input channels (length of ``s``).
        alpha: Migration strength used.
        scale_min: Smallest ``s_j``.
        scale_max: Largest ``s_j``.
        scale_geomean: Geometric mean of ``s``.
        act_absmax_before: max |x| of the activation over all channels, before.
        act_absmax_after: The same after dividing by ``s``.
        act_outlier_before: Largest channel max|x| over the median channel, before.
        act_outlier_after: The same after smoothing (1.0 is perfectly flat).
        weight_absmax_before: max |w| over the smoothed weights, before.
        weight_absmax_after: The same after multiplying the rows by ``s``.
        weight_outlier_before: Largest input-channel (row) max|w| over the median row, before. When
            it exceeds ``act_outlier_before`` the weights carry outliers of their own, and a small
            alpha moves them into the activation.
        weight_outlier_after: The same after smoothing.
    """

    nodes: tuple[str, ...]
    tensor: str
    smoothed_tensor: str
    weights: tuple[str, ...]
    placement: Placement
    folded_into: str
    channels: int
    alpha: float
    scale_min: float
    scale_max: float
    scale_geomean: float
    act_absmax_before: float
    act_absmax_after: float
    act_outlier_before: float
    act_outlier_after: float
    weight_absmax_before: float
    weight_absmax_after: float
    weight_outlier_before: float
    weight_outlier_after: float


@dataclass(frozen=True)
class SkippedNode(_json.Serializable):
    """A node of a smoothed op type that was left as it was.

    Attributes:
        node: Node name.
        reason: Why, e.g. its weight is not an initializer (attention's ``Q @ K^T``).
    """

    node: str
    reason: str


@dataclass(frozen=True)
class SmoothingResult:
    """The smoothed FP32 model and the record of every migration.

    Attributes:
        model: The smoothed FP32 model; its outputs equal the original's to float rounding.
        migrations: One entry per smoothed activation tensor, in graph order.
        skipped: Nodes of a smoothed op type that were not smoothed, with the reason.
        config: The settings used.
        n_batches: Calibration feeds consumed to measure the activations.
        n_samples: Samples in those feeds.
    """

    model: onnx.ModelProto = field(compare=False)
    migrations: tuple[Migration, ...]
    skipped: tuple[SkippedNode, ...] = ()
    config: SmoothingConfig = field(default_factory=SmoothingConfig)
    n_batches: int = 0
    n_samples: int = 0

    @property
    def nodes(self) -> tuple[str, ...]:
        """Every smoothed node, in graph order."""
        return tuple(name for m in self.migrations for name in m.nodes)

    def migration_of(self, node: str) -> Migration:
        """The migration that smoothed ``node``.

        Raises:
            ModelError: ``node`` was not smoothed (close names are suggested).
        """
        for migration in self.migrations:
            if node in migration.nodes:
                return migration
        raise unknown("smoothed node", node, self.nodes)

    def to_dict(self) -> dict[str, Any]:
        """Returns the provenance (not the model bytes) as JSON-ready data."""
        found = _SmoothingProvenance(self.migrations, self.skipped, self.config, self.n_batches,
                                     self.n_samples)
        return found.to_dict()

    @classmethod
    def from_dict(cls, data: Any, model: onnx.ModelProto, source: str = "<data>") -> SmoothingResult:
        """Rebuilds a result from :meth:`to_dict` output and the smoothed model it describes.

        Raises:
            FormatError: ``data`` is not what :meth:`to_dict` writes (``source`` and the field named).
        """
        found = _SmoothingProvenance.from_dict(data, source)
        return cls(model, found.migrations, found.skipped, found.config, found.n_batches, found.n_samples)


@dataclass(frozen=True)
class _SmoothingProvenance(_json.Serializable):
    """What JSON holds of a :class:`SmoothingResult`: everything but the model."""

    migrations: tuple[Migration, ...]
    skipped: tuple[SkippedNode, ...] = ()
    config: SmoothingConfig = field(default_factory=SmoothingConfig)
    n_batches: int = 0
    n_samples: int = 0


_SmoothingProvenance.__name__ = "SmoothingResult"  # what its FormatErrors call it: the JSON form of one
