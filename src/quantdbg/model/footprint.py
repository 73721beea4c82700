"""What a result cost: the size of the model it was computed on and the memory its process used.

Results of the stages that run a whole model (calibration, sensitivity, fallback) carry one, so a
report says how big the model was and how much memory the run took, the figures that decide whether
a larger model fits the machine.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass

import onnx

from quantdbg._json import Serializable
from quantdbg.model.external import weight_bytes


@dataclass(frozen=True)
class Footprint(Serializable):
    """The model's weight bytes and the process's peak memory when a result was made.

    Attributes:
        weight_bytes: Bytes of the model's initializers, those kept in a data file included
            (counted from their shapes and types: the weights are not read).
        peak_rss_bytes: Peak resident set size of the process so far (``getrusage``): the whole
            process, not this step alone; 0 where the platform does not say.
    """

    weight_bytes: int
    peak_rss_bytes: int

    def describe(self) -> str:
        """``Model weights 1.12 GiB, peak RSS 3.02 GiB (2.7x the weights)``."""
        text = f"Model weights {_gib(self.weight_bytes)}"
        if self.peak_rss_bytes:
            text += f", peak RSS {_gib(self.peak_rss_bytes)}"
            if self.weight_bytes:
                text += f" ({self.peak_rss_bytes / self.weight_bytes:.1f}x the weights)"
        return text


def footprint(model: onnx.ModelProto) -> Footprint:
    """The footprint of a run on ``model`` now: its weight bytes and this process's peak RSS."""
    return Footprint(weight_bytes(model), peak_rss_bytes())


def peak_rss_bytes() -> int:
    """This process's peak resident set size in bytes (0 where ``resource`` is missing: Windows)."""
    try:
        import resource
    except ImportError:
        return 0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak) if sys.platform == "darwin" else int(peak) * 1024  # bytes on macOS, KiB elsewhere


def _gib(n: int) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.2f} {unit}" if unit == "GiB" else f"{n / size:.1f} {unit}"
    return f"{n} B"
