"""Calibrator specs: each calibrator's name and config class, below :mod:`quantdbg.config`.

A calibrator is chosen by a registered name (``"entropy"``) or an instance of that calibrator's
config dataclass (``PercentileConfig(99.9)``). :class:`~quantdbg.config.CalibConfig` writes and
reads such choices as JSON, so the name <-> config class table lives here, under it, and not in
the calibrator registry above it: reading a config never depends on what was imported before.
The built-in calibrators' configs are defined here and listed from the start; the calibrator
registry (:func:`quantdbg.calibration.register_calibrator`) adds a plugin's pair when it
registers, and entry points (group :data:`ENTRY_POINT_GROUP`) load on the first name or config
this table does not know.
"""
from __future__ import annotations

import dataclasses
import difflib
import warnings
from dataclasses import dataclass
from importlib import metadata
from typing import Any

from quantdbg.errors import ConfigError, QuantDbgWarning
from quantdbg.quant_math import QMAX

ENTRY_POINT_GROUP = "quantdbg.calibrators"

NUM_LEVELS = QMAX + 1
"""Positive INT8 levels plus zero: the magnitudes a symmetric 8-bit tensor can take."""


def validate_num_bins(owner: str, num_bins: int | None, minimum: int) -> None:
    """Raises ConfigError unless ``num_bins`` is None or an int >= ``minimum``."""
    if num_bins is not None and (not isinstance(num_bins, int) or num_bins < minimum):
        raise ConfigError(f"{owner}.num_bins must be None (the collected resolution) or an integer "
                          f">= {minimum}, got {num_bins!r}.")


@dataclass(frozen=True)
class MinMaxConfig:
    """``minmax`` has no options; the class exists so the choice can be a config instance."""


@dataclass(frozen=True)
class PercentileConfig:
    """Options of ``percentile``.

    Attributes:
        percentile: Percent of |x| values the range must cover, in (50, 100].
        num_bins: Histogram resolution (None: the collected resolution).
    """

    percentile: float = 99.99
    num_bins: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.percentile, bool) or not isinstance(self.percentile, (int, float)) \
                or not 50 < self.percentile <= 100:
            raise ConfigError(f"PercentileConfig.percentile must be in (50, 100], got {self.percentile!r}.")
        validate_num_bins("PercentileConfig", self.num_bins, 2)


@dataclass(frozen=True)
class EntropyConfig:
    """Options of ``entropy``.

    Attributes:
        num_bins: Histogram resolution (None: the collected resolution, 2048 by default).
        start_bin: First candidate threshold bin (>= 128, as in TensorRT).
    """

    num_bins: int | None = None
    start_bin: int = 128

    def __post_init__(self) -> None:
        validate_num_bins("EntropyConfig", self.num_bins, 2 * NUM_LEVELS)
        if isinstance(self.start_bin, bool) or not isinstance(self.start_bin, int) \
                or self.start_bin < NUM_LEVELS:
            raise ConfigError(f"EntropyConfig.start_bin must be an integer >= {NUM_LEVELS}, "
                              f"got {self.start_bin!r}.")
        if self.num_bins is not None and self.start_bin >= self.num_bins:
            raise ConfigError(f"EntropyConfig.start_bin ({self.start_bin}) must be below num_bins "
                              f"({self.num_bins}).")


@dataclass(frozen=True)
class MseConfig:
    """Options of ``mse``.

    Attributes:
        num_bins: Histogram resolution (None: the collected resolution).
        start_bin: First candidate clip, in bins (as pytorch-quantization's ``start_bin``), so
            a clip never falls below ``start_bin / num_bins`` of max |x|.
    """

    num_bins: int | None = None
    start_bin: int = 128

    def __post_init__(self) -> None:
        validate_num_bins("MseConfig", self.num_bins, 2)
        if isinstance(self.start_bin, bool) or not isinstance(self.start_bin, int) or self.start_bin < 1:
            raise ConfigError(f"MseConfig.start_bin must be an integer >= 1, got {self.start_bin!r}.")


_SPECS: dict[str, type] = {"minmax": MinMaxConfig, "entropy": EntropyConfig,
                           "percentile": PercentileConfig, "mse": MseConfig}
_PLUGINS_LOADED = False


def register_spec(name: str, config: type) -> None:
    """Records that calibrator ``name`` is configured by ``config`` (the calibrator registry calls it).

    Raises:
        ConfigError: ``name`` has another config class, or ``config`` configures another name.
    """
    old = _SPECS.get(name)
    if old is not None and old.__qualname__ != config.__qualname__:  # re-imports bring new class objects
        raise ConfigError(f"Calibrator name {name!r} is already registered with {old.__qualname__}; "
                          "choose another name.")
    for other, cls in _SPECS.items():
        if cls is config and other != name:
            raise ConfigError(f"{config.__name__} already configures calibrator {other!r}; "
                              "each calibrator needs its own config class.")
    _SPECS[name] = config


def load_plugins() -> None:
    """Loads the entry points of group :data:`ENTRY_POINT_GROUP` once (a broken one warns)."""
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
        if ep.name not in _SPECS:
            warnings.warn(f"Calibrator plugin {ep.name!r} ({ep.value}) loaded but registered no "
                          f"calibrator named {ep.name!r}; decorate its class with "
                          f"@register_calibrator({ep.name!r}, config=...).", QuantDbgWarning, stacklevel=3)


def spec_names() -> tuple[str, ...]:
    """Every calibrator name (built-ins and entry-point plugins), sorted."""
    load_plugins()
    return tuple(sorted(_SPECS))


def spec_name(spec: Any) -> str:
    """The calibrator name a spec (name or config instance) refers to.

    Raises:
        ConfigError: The spec is not a registered name or a registered config instance.
    """
    if isinstance(spec, str):
        if spec not in _SPECS:
            load_plugins()
        if spec in _SPECS:
            return spec
        near = difflib.get_close_matches(spec, list(_SPECS), n=3)
        hint = f" Did you mean {', '.join(map(repr, near))}?" if near else ""
        raise ConfigError(f"No calibrator named {spec!r}.{hint} Registered: {', '.join(sorted(_SPECS))}.")
    if dataclasses.is_dataclass(spec) and not isinstance(spec, type):
        name = _configured_by(spec)
        if name is None:
            load_plugins()
            name = _configured_by(spec)
        if name is not None:
            return name
        raise ConfigError(f"{type(spec).__name__} is not the config of any registered calibrator; "
                          "register it with @register_calibrator(name, config=...).")
    raise ConfigError(f"A calibrator is chosen by a registered name or a config instance, got "
                      f"{type(spec).__name__} {spec!r}.")


def _configured_by(spec: Any) -> str | None:
    return next((name for name, config in _SPECS.items() if type(spec) is config), None)


def spec_config(name: str) -> type:
    """The config class of calibrator ``name`` (ConfigError with suggestions when unknown)."""
    return _SPECS[spec_name(name)]
