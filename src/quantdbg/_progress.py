"""Progress reporting: a tqdm bar when asked for and installed, log lines otherwise; never print."""
from __future__ import annotations

import logging
import weakref
from collections.abc import Iterable, Iterator
from typing import TypeVar

from quantdbg import _optional

logger = logging.getLogger("quantdbg")

T = TypeVar("T")

_OPEN_BARS: weakref.WeakSet = weakref.WeakSet()  # bars drawn and not yet closed, for close_bars()


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
        bar = tqdm.tqdm(iterable, total=_total(iterable, total), desc=desc, unit=unit, leave=False)
        _OPEN_BARS.add(bar)
        try:
            yield from bar
        finally:
            bar.close()
        return
    level = logging.INFO if enabled else logging.DEBUG
    total = _total(iterable, total)
    of = f"/{total}" if total is not None else ""
    for index, item in enumerate(iterable):
        logger.log(level, "%s: %s %d%s", desc, unit, index + 1, of)
        yield item


def _total(iterable: Iterable[object], total: int | None) -> int | None:
    # Batched data knows how many feeds it yields; its len() counts samples, which would leave a bar
    # counted in batches unfinished.
    return getattr(iterable, "num_batches", None) if total is None else total


def close_bars() -> None:
    """Closes every progress bar still drawn, so what is printed next starts on a line of its own."""
    for bar in list(_OPEN_BARS):
        bar.close()
