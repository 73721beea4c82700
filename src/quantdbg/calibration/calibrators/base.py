"""The calibrator registry (entry-point group ``quantdbg.calibrators``): name or config -> calibrator.

Calibrators are registered by name together with their own frozen config dataclass (after
torchao), so a choice is either a name (default config) or a config instance. The built-in
calibrators are a static table here (:data:`BUILTINS`): their modules define the classes and
import only :mod:`~quantdbg.calibration.calibrators.calibrator`, never this registry, so every
lookup knows them whatever was imported before. Others register with the decorator::

    @register_calibrator("halfmax", config=HalfMaxConfig)
    class HalfMax(Calibrator):
        def compute_amax(self, stats): ...

Third-party packages register theirs by declaring an entry point in the group
``quantdbg.calibrators`` that points at the decorated class (or its module); entry points are
loaded on the first lookup of a name or config class not known yet. Names and config classes
live in :mod:`quantdbg._calibrator_specs`, below :mod:`quantdbg.config`, so a CalibConfig reads
back whatever was imported; this module maps them to the calibrator classes.
"""
from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from quantdbg._calibrator_specs import register_spec, spec_config, spec_name, spec_names
from quantdbg.calibration.calibrators.calibrator import Calibrator
from quantdbg.calibration.calibrators.entropy import EntropyCalibrator
from quantdbg.calibration.calibrators.minmax import MinMaxCalibrator
from quantdbg.calibration.calibrators.mse import MseCalibrator
from quantdbg.calibration.calibrators.percentile import PercentileCalibrator
from quantdbg.calibration.stats import TensorStats
from quantdbg.errors import ConfigError, NotCalibratedError, QuantDbgWarning

BUILTINS: tuple[type[Calibrator], ...] = (
    EntropyCalibrator, MinMaxCalibrator, MseCalibrator, PercentileCalibrator)
"""The built-in calibrators (their names and configs are also listed from the start in
:mod:`quantdbg._calibrator_specs`, which sits below the calibrators and cannot import them)."""

_IMPLS: dict[str, type] = {cls.name: cls for cls in BUILTINS}
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


def available_calibrators() -> tuple[str, ...]:
    """Names of every registered calibrator (built-ins and entry-point plugins), sorted."""
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
