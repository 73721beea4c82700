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
loaded on the first lookup.
"""
from __future__ import annotations

import dataclasses
import difflib
import importlib
import logging
import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import metadata
from typing import Any, ClassVar, Protocol, TypeVar, runtime_checkable

from quantdbg import _json
from quantdbg.calibration.stats import HIST_OVERSAMPLE, BinnedHistogram, TensorStats
from quantdbg.config import CalibratorChoice, CalibratorSpec, register_spec_codec
from quantdbg.errors import ConfigError, FormatError, NotCalibratedError, QuantDbgWarning
from quantdbg.quant_math import scale_from_amax

logger = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "quantdbg.calibrators"

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


@dataclass(frozen=True)
class _Entry:
    name: str
    cls: type
    config: type


_REGISTRY: dict[str, _Entry] = {}
_PLUGINS_LOADED = False

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
        old = _REGISTRY.get(name)
        if old is not None and old.cls.__qualname__ != cls.__qualname__:
            raise ConfigError(f"Calibrator name {name!r} is already registered to {old.cls.__qualname__}; "
                              "choose another name.")
        for entry in _REGISTRY.values():
            if entry.config is config and entry.name != name:
                raise ConfigError(f"{config.__name__} already configures calibrator {entry.name!r}; "
                                  "each calibrator needs its own config class.")
        cls.name = name  # type: ignore[attr-defined]
        cls.config_class = config  # type: ignore[attr-defined]
        _REGISTRY[name] = _Entry(name, cls, config)
        return cls

    return decorate


def _load_builtins() -> None:
    importlib.import_module("quantdbg.calibration.calibrators")  # its __init__ imports the built-in modules


def _load_plugins() -> None:
    global _PLUGINS_LOADED
    if _PLUGINS_LOADED:
        return
    _PLUGINS_LOADED = True
    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
        try:
            ep.load()
        except Exception as err:  # a broken plugin must not break the built-in calibrators
            warnings.warn(f"Calibrator plugin {ep.name!r} ({ep.value}) failed to load and is skipped: "
                          f"{type(err).__name__}: {err}", QuantDbgWarning, stacklevel=3)
            continue
        if ep.name not in _REGISTRY:
            warnings.warn(f"Calibrator plugin {ep.name!r} ({ep.value}) loaded but registered no "
                          f"calibrator named {ep.name!r}; decorate its class with "
                          f"@register_calibrator({ep.name!r}, config=...).", QuantDbgWarning, stacklevel=3)


def available_calibrators() -> tuple[str, ...]:
    """Names of every registered calibrator (built-ins and entry-point plugins), sorted."""
    _load_builtins()
    _load_plugins()
    return tuple(sorted(_REGISTRY))


def calibrator_name(spec: Any) -> str:
    """Returns the registered name a spec (name or config instance) refers to.

    Raises:
        ConfigError: The spec is not a registered name or a registered config instance.
    """
    return _entry_for(spec).name


def _entry_for(spec: Any) -> _Entry:
    _load_builtins()
    if isinstance(spec, str):
        if spec not in _REGISTRY:
            _load_plugins()
        if spec in _REGISTRY:
            return _REGISTRY[spec]
        near = difflib.get_close_matches(spec, list(_REGISTRY), n=3)
        hint = f" Did you mean {', '.join(map(repr, near))}?" if near else ""
        raise ConfigError(f"No calibrator named {spec!r}.{hint} Registered: {', '.join(sorted(_REGISTRY))}.")
    if dataclasses.is_dataclass(spec) and not isinstance(spec, type):
        _load_plugins()
        for entry in _REGISTRY.values():
            if type(spec) is entry.config:
                return entry
        raise ConfigError(f"{type(spec).__name__} is not the config of any registered calibrator; "
                          "register it with @register_calibrator(name, config=...).")
    raise ConfigError(f"A calibrator is chosen by a registered name or a config instance, got "
                      f"{type(spec).__name__} {spec!r}.")


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
    entry = _entry_for(spec)
    return entry.cls(spec if not isinstance(spec, str) else entry.config())


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


class RegistrySpecCodec:
    """Calibrator specs <-> :class:`~quantdbg.config.CalibratorChoice`, through this registry.

    Installed as the codec of :class:`~quantdbg.config.CalibConfig`'s JSON form when this module
    is imported. A config instance is written with the codec's encoding of its fields and read
    back by its registered config class.
    """

    def choice(self, spec: CalibratorSpec) -> CalibratorChoice:
        """The JSON form of ``spec``.

        Raises:
            ConfigError: The spec is not a registered name or a registered config instance.
        """
        name = calibrator_name(spec)
        return CalibratorChoice(name, None if isinstance(spec, str) else _json.encode(spec))

    def spec(self, choice: CalibratorChoice, where: str) -> CalibratorSpec:
        """The spec ``choice`` describes: the name, or an instance of its config class.

        Raises:
            FormatError: The calibrator is not registered or its config fields do not match
                its config class (the message names ``where``).
        """
        try:
            entry = _entry_for(choice.calibrator)
        except ConfigError as err:
            raise FormatError(f"field {where!r}: {err}") from None
        if choice.config is None:
            return entry.name
        return _json.decode(entry.config, dict(choice.config), f"{where}.config")


register_spec_codec(RegistrySpecCodec())


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


def validate_num_bins(owner: str, num_bins: int | None, minimum: int) -> None:
    """Raises ConfigError unless ``num_bins`` is None or an int >= ``minimum``."""
    if num_bins is not None and (not isinstance(num_bins, int) or num_bins < minimum):
        raise ConfigError(f"{owner}.num_bins must be None (the collected resolution) or an integer "
                          f">= {minimum}, got {num_bins!r}.")
