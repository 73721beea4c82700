"""TensorRT calibration caches and JSON scale files.

A TensorRT calibration cache is text: a header ``TRT-<version>-<calibrator>`` (for instance
``TRT-100300-EntropyCalibration2``), then one ``tensor_name: <8 hex digits>`` line per tensor,
the digits being the big-endian IEEE float32 scale (``amax / 127``). For example
``images: 3c010a14`` is scale 0.0078759, amax ~1.0.
"""
from __future__ import annotations

import math
import os
import re
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from quantdbg import _display, _json
from quantdbg._io import write_text_atomic
from quantdbg.calibration import CalibrationResult
from quantdbg.calibration.calibrators.base import calibrator_name
from quantdbg.config import TensorKind
from quantdbg.errors import ConfigError, DataError
from quantdbg.qdq.records import QuantizedModel
from quantdbg.quant_math import QMAX

ScaleSource = CalibrationResult | QuantizedModel | Mapping[str, float]
"""Where activation scales come from: a calibration, a Q/DQ model's records (the scales actually
inserted, shared Concat scales included), or a plain tensor name -> scale mapping."""

DEFAULT_TRT_VERSION = 100300
"""TensorRT 10.3.0, as TensorRT writes it in cache headers (major*10000 + minor*100 + patch)."""

DEFAULT_ALGORITHM = "EntropyCalibration2"
"""The calibrator name of a cache header unless the calibration was a pure max calibration."""
MINMAX_ALGORITHM = "MinMaxCalibration"
"""TensorRT's name for a pure max calibration (every calibrator of the config is ``minmax``)."""

_HEADER = re.compile(r"^TRT-(\d+)-([A-Za-z0-9_]+)$")
_HEX = re.compile(r"^[0-9a-fA-F]{8}$")


@dataclass(frozen=True)
class TrtCache(_json.Serializable):
    """The content of a TensorRT calibration cache.

    Attributes:
        scales: Tensor name -> float32 scale, in file order.
        version: TensorRT version number from the header (e.g. 100300).
        algorithm: Calibrator name from the header (e.g. ``EntropyCalibration2``).
    """

    scales: Mapping[str, float]
    version: int = DEFAULT_TRT_VERSION
    algorithm: str = DEFAULT_ALGORITHM

    def __post_init__(self) -> None:
        object.__setattr__(self, "scales", MappingProxyType(dict(self.scales)))

    def amax(self) -> dict[str, float]:
        """Tensor name -> ``scale * 127``."""
        return {name: scale * QMAX for name, scale in self.scales.items()}


def scale_to_hex(scale: float) -> str:
    """The 8 hex digits TensorRT writes for ``scale`` (big-endian float32)."""
    return struct.pack(">f", scale).hex()


def hex_to_scale(digits: str) -> float:
    """Inverse of :func:`scale_to_hex`."""
    return struct.unpack(">f", bytes.fromhex(digits))[0]


@dataclass(frozen=True)
class ScaleEntry(_json.Serializable):
    """One activation tensor's scale.

    Attributes:
        scale: float32 scale ``amax / 127``.
        amax: The symmetric clip.
        method: Calibrator that chose it (None when unknown).
    """

    scale: float
    amax: float
    method: str | None


def scale_entries(source: ScaleSource) -> dict[str, ScaleEntry]:
    """Tensor name -> :class:`ScaleEntry` for the activation tensors of ``source``.

    Raises:
        ConfigError: A scale is not finite and positive, a name cannot sit on one cache line,
            or one tensor has two different scales among a Q/DQ model's records.
    """
    entries: dict[str, ScaleEntry] = {}
    if isinstance(source, CalibrationResult):
        entries = {n: ScaleEntry(r.scale, r.amax, r.method) for n, r in source.ranges.items()}
    elif isinstance(source, QuantizedModel):
        for record in source.records:
            if record.kind is not TensorKind.ACTIVATION:
                continue
            entry = ScaleEntry(record.scale[0], record.amax[0], record.calibrator)
            if entries.setdefault(record.tensor, entry).scale != entry.scale:
                raise ConfigError(f"Tensor {record.tensor!r} has two scales in the Q/DQ model "
                                  f"({entries[record.tensor].scale} and {entry.scale}); a calibration "
                                  "cache holds one per tensor.")
    else:
        entries = {str(n): ScaleEntry(float(v), float(v) * QMAX, None) for n, v in source.items()}
    for name, entry in entries.items():
        if not (math.isfinite(entry.scale) and entry.scale > 0):
            raise ConfigError(f"Tensor {name!r} has scale {entry.scale}; a calibration cache needs finite "
                              "scales > 0.")
        _check_cache_name(name)
    return entries


def _check_cache_name(name: str) -> None:
    """Refuses a name the reader could not read back: blank, spanning lines (any of str.splitlines'
    line boundaries: ``\r``, ``\x85``, ``\u2028``...), or not encodable as UTF-8."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        raise ConfigError(f"Tensor name {name!r} cannot be written to a cache (not valid UTF-8).") from None
    if not name.strip() or len(f"{name}: 0".splitlines()) != 1:
        raise ConfigError(f"Tensor name {name!r} cannot be written on one cache line.")


def cache_algorithm(source: ScaleSource) -> str:
    """The calibrator name a cache header carries for ``source``, from its calibration config:
    :data:`MINMAX_ALGORITHM` when every calibrator the config names (default, per op, per tensor) is
    ``minmax``, else :data:`DEFAULT_ALGORITHM` (also for scales without a calibration)."""
    calibration = source if isinstance(source, CalibrationResult) else (
        source.calibration if isinstance(source, QuantizedModel) else None)
    if calibration is None:
        return DEFAULT_ALGORITHM
    config = calibration.config
    specs = (config.method, *config.per_op.values(), *config.per_tensor.values())
    return MINMAX_ALGORITHM if {calibrator_name(spec) for spec in specs} == {"minmax"} else DEFAULT_ALGORITHM


def format_trt_cache(source: ScaleSource, version: int = DEFAULT_TRT_VERSION,
                     algorithm: str | None = None) -> str:
    """Renders a TensorRT calibration cache.

    Args:
        source: A calibration result, a Q/DQ model (its activation records), or name -> scale.
        version: TensorRT version number for the header.
        algorithm: Calibrator name for the header (None: :func:`cache_algorithm` of ``source``).

    Returns:
        The cache text (header line, then one line per tensor, newline-terminated).

    Raises:
        ConfigError: A scale is not finite and positive, a name spans lines, or the header
            fields are malformed.
    """
    if isinstance(version, bool) or not isinstance(version, int) or version < 0:
        raise ConfigError(f"TensorRT version must be a non-negative integer such as 100300, got {version!r}.")
    algorithm = cache_algorithm(source) if algorithm is None else algorithm
    if not re.fullmatch(r"[A-Za-z0-9_]+", algorithm):
        raise ConfigError(f"Calibrator name {algorithm!r} in a cache header must be alphanumeric.")
    lines = [f"TRT-{version}-{algorithm}"]
    lines += [f"{name}: {scale_to_hex(e.scale)}" for name, e in scale_entries(source).items()]
    return "\n".join(lines) + "\n"


def write_trt_cache(source: ScaleSource, path: str | os.PathLike, version: int = DEFAULT_TRT_VERSION,
                    algorithm: str | None = None) -> Path:
    """Writes a TensorRT calibration cache atomically (see :func:`format_trt_cache`).

    Args:
        source: A calibration result, a Q/DQ model (its activation records), or name -> scale.
        path: Destination file; its folder must exist.
        version: TensorRT version number for the header.
        algorithm: Calibrator name for the header (None: :func:`cache_algorithm` of ``source``).

    Returns:
        The destination path.

    Raises:
        ConfigError: Invalid scales or header fields, or the folder does not exist.
    """
    return write_text_atomic(path, format_trt_cache(source, version, algorithm))


def parse_trt_cache(text: str, source: str = "<cache>") -> TrtCache:
    """Parses TensorRT calibration cache text.

    Args:
        text: The cache content.
        source: Names the cache in error messages (usually its path).

    Returns:
        The parsed cache.

    Raises:
        DataError: Bad header or line, or a scale that is not finite and positive; the message
            gives the line number and what was expected.
    """
    lines = text.splitlines()
    header = _HEADER.match(lines[0].strip()) if lines else None
    if header is None:
        found = lines[0][:60] if lines else "an empty file"
        raise DataError(f"{source}, line 1: expected a header like 'TRT-100300-EntropyCalibration2', "
                        f"found {found!r}.")
    scales: dict[str, float] = {}
    for number, line in enumerate(lines[1:], start=2):
        if not line.strip():
            continue
        name, sep, digits = line.rpartition(":")  # names may contain ':'; the value never does
        digits = digits.strip()
        if not sep or not name.strip() or not _HEX.match(digits):
            raise DataError(f"{source}, line {number}: expected 'tensor_name: <8 hex digits>', "
                            f"found {line[:80]!r}.")
        if name in scales:
            raise DataError(f"{source}, line {number}: tensor {name!r} appears twice.")
        scale = hex_to_scale(digits)
        if not (math.isfinite(scale) and scale > 0):
            raise DataError(f"{source}, line {number}: tensor {name!r} has scale {scale}; a calibration "
                            "cache holds finite scales > 0.")
        scales[name] = scale
    return TrtCache(MappingProxyType(scales), int(header.group(1)), header.group(2))


def read_trt_cache(path: str | os.PathLike) -> TrtCache:
    """Reads a TensorRT calibration cache.

    Raises:
        DataError: The file is missing or unreadable, or a line is malformed (the message gives
            the line number).
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise DataError(f"Cannot read calibration cache {str(path)!r}: {err}") from err
    return parse_trt_cache(text, str(path))


def _untagged_scales(data: dict[str, Any]) -> dict[str, Any] | None:
    """A scales file written before it had a tag: tensor name -> entry, every entry an object with a
    ``scale``."""
    if data and all(isinstance(entry, dict) and "scale" in entry for entry in data.values()):
        return {"tensors": data}
    return None


@_json.document("quantdbg.scales", 1, untagged=_untagged_scales)
@dataclass(frozen=True, repr=False)
class CalibrationScales(_display.Displayable, _json.Serializable):
    """What ``quantdbg calibrate --scales`` writes: each activation tensor's scale, clip and
    calibrator (no statistics; a :class:`~quantdbg.calibration.CalibrationResult` has those).

    Attributes:
        tensors: Activation tensor name -> its entry.

    Raises:
        DataError: A scale is not finite and positive, or a clip is not finite (the tensor is named).
    """

    tensors: Mapping[str, ScaleEntry]

    def __post_init__(self) -> None:
        object.__setattr__(self, "tensors", MappingProxyType(dict(self.tensors)))
        for name, entry in self.tensors.items():
            if not (math.isfinite(entry.scale) and entry.scale > 0 and math.isfinite(entry.amax)):
                raise DataError(f"tensor {name!r} needs a finite positive 'scale' and a finite 'amax', "
                                f"found scale {entry.scale} and amax {entry.amax}.")


def scales_of(source: ScaleSource) -> CalibrationScales:
    """The :class:`CalibrationScales` of ``source`` (see :func:`scale_entries` for the errors)."""
    return CalibrationScales(scale_entries(source))


def write_scales_json(source: ScaleSource, path: str | os.PathLike) -> Path:
    """Writes :func:`scales_of` ``source`` to ``path`` as JSON, atomically.

    Returns:
        The destination path.

    Raises:
        ConfigError: Invalid scales, or the folder does not exist.
    """
    return scales_of(source).write(path)


def read_scales_json(path: str | os.PathLike) -> CalibrationScales:
    """Reads a JSON scales file written by :func:`write_scales_json` (or by quantdbg 0.1.0, untagged).

    Raises:
        FormatError: The file is missing, not JSON, or not a scales file; an entry lacks a finite
            positive ``scale`` (the message names the file and the tensor).
    """
    return CalibrationScales.read(path)
