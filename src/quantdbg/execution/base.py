"""The execution seam: how independent tasks run (here, in forked processes, or on a Ray cluster).

Work that splits into independent tasks -- calibration shards, sensitivity variants, the
evaluations of one fallback-search round -- goes through an :class:`Executor`:
``map(fn, items, shared=...)`` runs ``fn(shared, item)`` for every item and returns the results in
the order of ``items``, whatever order they finish in. ``shared`` is what every task reads (models,
data, an evaluator): it travels to each worker once, not once per task, and each worker keeps its
copy for the whole map, so an object that opens a session on first use opens it once per worker.
"""
from __future__ import annotations

import copyreg
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Any, Protocol, TypeVar, runtime_checkable

T = TypeVar("T")
R = TypeVar("R")

TaskFunction = Callable[[Any, Any], Any]
"""``fn(shared, item) -> result``: a module-level function (it is sent to workers by reference)."""

OnResult = Callable[[int, Any], None]
"""``on_result(index, result)``: called on the driver as each task finishes, in finishing order."""


@runtime_checkable
class Executor(Protocol):
    """Runs independent tasks and returns their results in input order."""

    def workers(self) -> int:
        """How many tasks can run at once (the default number of calibration shards); a method, not a
        property, so that ``isinstance(x, Executor)`` never connects to a cluster."""
        ...

    def map(self, fn: Callable[[Any, T], R], items: Sequence[T], *, shared: Any = None,
            on_result: OnResult | None = None, desc: str = "tasks", progress: bool = False) -> list[R]:
        """Runs ``fn(shared, item)`` for every item.

        Args:
            fn: A module-level function of (shared, item).
            items: The tasks' arguments (small: each is sent with its task).
            shared: What every task reads; sent to each worker once.
            on_result: Called on the driver with (index, result) as each task finishes.
            desc: Labels the progress bar / log lines (tasks done / total).
            progress: Show a progress bar (else log lines at DEBUG).

        Returns:
            One result per item, in the order of ``items``.
        """
        ...


def _read_only(items: dict[Any, Any]) -> Mapping[Any, Any]:
    return MappingProxyType(items)


def _reduce_read_only(proxy: Mapping[Any, Any]) -> tuple[Any, tuple[dict[Any, Any]]]:
    return _read_only, (dict(proxy),)


# Frozen results hold read-only mappings; pickle refuses them, and a shared object or a task's result
# must cross to another process. They travel as plain dicts and are wrapped again on arrival.
copyreg.pickle(MappingProxyType, _reduce_read_only)  # type: ignore[arg-type]

__all__ = ["Executor", "OnResult", "TaskFunction"]
