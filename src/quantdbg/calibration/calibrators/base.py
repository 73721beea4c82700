"""Calibrator protocol, range types and the registry (entry-point group ``quantdbg.calibrators``).

A calibrator turns one tensor's :class:`~quantdbg.stats.TensorStats` into a symmetric
:class:`TensorRange`. Calibrators are registered by name together with their own frozen config
dataclass (after torchao), so a choice is either a name (default config) or a config instance::

    @register_calibrator("percentile", config=PercentileConfig)
    class PercentileCalibrator(Calibrator):
        needs_histogram = True
        def compute_amax(self, stats): ...

Third-party packages register theirs by declaring an entry point in the group
``quantdbg.calibrators`` that points at the decorated class (or its module); entry points are
loaded on the first lookup of a name or config class not known yet. Names and config classes
live in :mod:`quantdbg._calibrator_specs`, below :mod:`quantdbg.config`, so a CalibConfig reads
back whatever was imported; this module holds the calibrator classes.
"""
from __future__ import annotations

import dataclasses
import importlib
import logging
import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, TypeVar, runtime_checkable

from quantdbg import _json
from quantdbg._calibrator_specs import register_spec, spec_config, spec_name, spec_names
from quantdbg.calibration.stats import HIST_OVERSAMPLE, BinnedHistogram, TensorStats
from quantdbg.errors import ConfigError, NotCalibratedError, QuantDbgWarning
from quantdbg.quant_math import scale_from_amax

logger = logging.getLogger(__name__)

ZERO_TENSOR_AMAX = 1.0
"""Range given to a tensor with no non-zero finite value: any scale represents zeros exactly, and
1.0 (scale 1/127) keeps a later non-zero value from saturating at a tiny clip."""


@dataclass(frozen=True)
class TensorRange(_json.Serializable):
    """The clipping range chosen for one tensor.

    Attributes:
        name: ONNX value name.
        lo: Lower clip (``-hi`` for symmetric quantization).
        hi: Upper clip.
        method: Name of the calibrator that chose it.
    """

    name: str
    lo: float
    hi: float
    method: str

    @property
    def amax(self) -> float:
        """The symmetric clip max(|lo|, |hi|)."""
        return float(max(abs(self.lo), abs(self.hi)))

    @property
    def scale(self) -> float:
        """Symmetric INT8 scale ``amax / 127``, rounded to float32 as stored in Q/DQ nodes."""
        return float(scale_from_amax(self.amax))


@runtime_checkable
class CalibratorProtocol(Protocol):
    """What calibrate() needs of a calibrator."""

    name: str
    needs_histogram: bool

    def compute(self, stats: TensorStats) -> TensorRange: ...


class Calibrator:
    """Base class: handles empty and all-zero tensors, then asks :meth:`compute_amax`.

    Args:
        config: An instance of the config dataclass the calibrator was registered with.
    """

    name: ClassVar[str] = "?"
    config_class: ClassVar[type] = type(None)
    needs_histogram: ClassVar[bool] = False

    def __init__(self, config: Any = None) -> None:
        self.config = config if config is not None else self.config_class()

    def compute(self, stats: TensorStats) -> TensorRange:
        """Returns the symmetric range ``[-amax, amax]`` chosen for ``stats``.

        A tensor with no non-zero finite value gets ``amax = ZERO_TENSOR_AMAX`` and a warning
        naming it (never a division by zero).

        Raises:
            ConfigError: The calibrator produced a non-finite or non-positive amax.
        """
        if stats.count == 0 or stats.absmax == 0.0:
            seen = "only zeros" if stats.count else "no finite values"
            bound = f"{ZERO_TENSOR_AMAX:g}"
            warnings.warn(f"Tensor {stats.name!r} had {seen} during calibration; it gets the range +-{bound} "
                          f"(scale {bound}/127): zeros stay exact in INT8, and the engine clips any value "
                          f"beyond +-{bound} at run time. Check that the calibration data exercises it.",
                          QuantDbgWarning, stacklevel=2)
            return TensorRange(stats.name, -ZERO_TENSOR_AMAX, ZERO_TENSOR_AMAX, self.name)
        amax = float(self.compute_amax(stats))
        if not (math.isfinite(amax) and amax > 0.0):
            raise ConfigError(f"Calibrator {self.name!r} returned amax={amax} for tensor {stats.name!r}; "
                              "expected a finite value > 0. This is a bug in the calibrator.")
        return TensorRange(stats.name, -amax, amax, self.name)

    def compute_amax(self, stats: TensorStats) -> float:
        """Returns the clip ``amax > 0`` for a tensor that has non-zero finite values."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.config!r})"


_IMPLS: dict[str, type] = {}
"""Calibrator name -> its class (names and config classes: :mod:`quantdbg._calibrator_specs`)."""

C = TypeVar("C", bound=type)


def register_calibrator(name: str, config: type) -> Callable[[C], C]:
    """Class decorator that registers a calibrator under ``name`` with its config dataclass.

    Args:
        name: The name users pass (``CalibConfig(method=name)``, ``--method name``).
        config: A frozen dataclass type; ``config()`` must build the default configuration.

    Returns:
        The decorator; it sets ``cls.name`` and ``cls.config_class``.

    Raises:
        ConfigError: ``config`` is not a dataclass, or ``name`` or ``config`` is already
            registered to another class.
    """
    if not (isinstance(config, type) and dataclasses.is_dataclass(config)):
        raise ConfigError(f"Calibrator {name!r}: config must be a dataclass type, got {config!r}.")

    def decorate(cls: C) -> C:
        old = _IMPLS.get(name)
        if old is not None and old.__qualname__ != cls.__qualname__:
            raise ConfigError(f"Calibrator name {name!r} is already registered to {old.__qualname__}; "
                              "choose another name.")
        register_spec(name, config)
        cls.name = name  # type: ignore[attr-defined]
        cls.config_class = config  # type: ignore[attr-defined]
        _IMPLS[name] = cls
        return cls

    return decorate


def _load_builtins() -> None:
    importlib.import_module("quantdbg.calibration.calibrators")  # its __init__ imports the built-in modules


def available_calibrators() -> tuple[str, ...]:
    """Names of every registered calibrator (built-ins and entry-point plugins), sorted."""
    _load_builtins()
    return spec_names()


def calibrator_name(spec: Any) -> str:
    """Returns the registered name a spec (name or config instance) refers to.

    Raises:
        ConfigError: The spec is not a registered name or a registered config instance.
    """
    return spec_name(spec)


def get_calibrator(spec: Any) -> Calibrator:
    """Builds the calibrator a spec names.

    Args:
        spec: A registered name (default configuration) or an instance of a registered
            calibrator's config dataclass, e.g. ``PercentileConfig(99.9)``.

    Returns:
        A calibrator instance holding its configuration.

    Raises:
        ConfigError: Unknown name (with close-match suggestions) or unregistered config type.
    """
    name = spec_name(spec)
    _load_builtins()
    return _IMPLS[name](spec if not isinstance(spec, str) else spec_config(name)())  # type: ignore[no-any-return]


def calibrator_amaxes(stats: TensorStats, names: Sequence[str] | None = None) -> dict[str, float]:
    """The clip each calibrator chooses for one tensor.

    Histogram calibrators are skipped when ``stats`` has no histogram, and so is a calibrator
    that cannot give the tensor a range.

    Args:
        stats: The tensor's statistics.
        names: Registered calibrator names (None: every registered calibrator, sorted).

    Returns:
        Calibrator name -> amax, in the order of ``names``.

    Raises:
        ConfigError: A name is not registered.
    """
    found: dict[str, float] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", QuantDbgWarning)  # an all-zero tensor warns once per calibrator
        for name in names or available_calibrators():
            calibrator = get_calibrator(name)
            if getattr(calibrator, "needs_histogram", False) and stats.hist is None:
                continue
            try:
                found[name] = float(calibrator.compute(stats).amax)
            except NotCalibratedError:
                continue
    return found


class HistogramCalibrator(Calibrator):
    """Base of the calibrators that read the |x| histogram at their own resolution.

    The config may have a ``num_bins`` field (None: the resolution the histogram was collected
    for, ``len(stats.hist) // HIST_OVERSAMPLE``).
    """

    needs_histogram: ClassVar[bool] = True

    def binned(self, stats: TensorStats) -> BinnedHistogram:
        """The tensor's histogram regrouped to this calibrator's resolution.

        Raises:
            NotCalibratedError: No histogram was collected for the tensor.
        """
        num_bins = getattr(self.config, "num_bins", None)
        if num_bins is None:
            num_bins = max(1, len(stats.hist) // HIST_OVERSAMPLE) if stats.hist is not None else 1
        return stats.binned(num_bins)
