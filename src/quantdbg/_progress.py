"""Progress reporting: a tqdm bar when asked for and installed, log lines otherwise; never print."""
from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from typing import TypeVar

from quantdbg import _optional

logger = logging.getLogger("quantdbg")

T = TypeVar("T")


def track(iterable: Iterable[T], *, total: int | None = None, desc: str = "", enabled: bool = False,
          unit: str = "batch") -> Iterator[T]:
    """Yields the items of ``iterable`` while reporting progress.

    With ``enabled`` and tqdm installed (extra ``report``) a bar is drawn on stderr; with
    ``enabled`` and no tqdm, each item is logged at INFO; otherwise at DEBUG.

    Args:
        iterable: The items.
        total: How many items are expected (None: unknown).
        desc: What is progressing, e.g. ``"calibration"``.
        enabled: Report visibly (bar or INFO lines).
        unit: What one item is, for the bar and the log lines.

    Yields:
        The items of ``iterable``, unchanged and in order.
    """
    if enabled and _optional.is_available("tqdm"):
        tqdm = _optional.load("tqdm", "report")
        yield from tqdm.tqdm(iterable, total=total, desc=desc, unit=unit, leave=False)
        return
    level = logging.INFO if enabled else logging.DEBUG
    of = f"/{total}" if total is not None else ""
    for index, item in enumerate(iterable):
        logger.log(level, "%s: %s %d%s", desc, unit, index + 1, of)
        yield item
