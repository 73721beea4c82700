"""Tasks on a Ray cluster: ``shared`` goes to the object store once, every item is a Ray task.

Ray is imported on first use (extra ``ray``). ``shared`` is put in the object store once per
:meth:`RayExecutor.map` (NumPy arrays inside it are then read zero-copy by workers on the same
node); each task carries only a reference to it and its own small item. A worker process keeps the
deserialized ``shared`` of the current map, so objects that open a session on first use open it
once per worker, not once per task. A task whose worker dies is run again (``max_retries``).
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from quantdbg import _optional
from quantdbg._progress import track
from quantdbg.errors import ConfigError
from quantdbg.execution.base import OnResult

logger = logging.getLogger(__name__)

ray = _optional.lazy_import("ray", "ray")

T = TypeVar("T")
R = TypeVar("R")

MAX_RETRIES = 3
"""Default number of times a task whose worker died is run again."""


class RayExecutor:
    """Runs tasks as Ray tasks, one CPU each.

    Args:
        address: The cluster to join: None starts a local Ray instance (or uses the one this
            process already initialised), ``"auto"`` joins the cluster started on this machine
            with ``ray start``, ``"HOST:PORT"`` joins that head node.
        max_retries: Times a task whose worker died is run again.

    Raises:
        ConfigError: ``max_retries`` below 0.
        MissingDependencyError: Ray is not installed (``pip install 'quantdbg[ray]'``), at first use.
    """

    def __init__(self, address: str | None = None, *, max_retries: int = MAX_RETRIES) -> None:
        if max_retries < 0:
            raise ConfigError(f"max_retries must be >= 0, got {max_retries}.")
        self.address = address
        self.max_retries = max_retries

    def __repr__(self) -> str:
        return f"RayExecutor(address={self.address!r}, max_retries={self.max_retries})"

    def connect(self) -> None:
        """Starts or joins the cluster unless this process is already connected to one."""
        if not ray.is_initialized():
            logger.info("starting Ray (%s)", "a local instance" if self.address is None else self.address)
            ray.init(address=self.address, logging_level=logging.WARNING, log_to_driver=False)

    def workers(self) -> int:
        """The cluster's CPUs (one task each)."""
        self.connect()
        return max(1, int(ray.cluster_resources().get("CPU", 1)))

    def map(self, fn: Callable[[Any, T], R], items: Sequence[T], *, shared: Any = None,
            on_result: OnResult | None = None, desc: str = "tasks", progress: bool = False) -> list[R]:
        """Runs ``fn(shared, item)`` for every item as a Ray task (see :class:`~quantdbg.execution.Executor`).

        Raises:
            Exception: What a task raised (after its retries, for a dead worker), re-raised here.
        """
        self.connect()
        items = list(items)
        if not items:
            return []
        # Wrapped in a list so that Ray passes the reference itself (a bare reference argument would
        # be fetched and deserialized again for every task).
        box = [ray.put(shared)]
        task = ray.remote(num_cpus=1, max_retries=self.max_retries)(_run_task)
        pending = {task.remote(fn, box, item): index for index, item in enumerate(items)}
        found: dict[int, R] = {}
        for index, result in track(_as_completed(pending), total=len(items), desc=desc, enabled=progress,
                                   unit="task"):
            found[index] = result
            if on_result is not None:
                on_result(index, result)
        return [found[i] for i in range(len(items))]


def _as_completed(pending: dict[Any, int]) -> Any:
    """Yields (index, result) as the tasks finish; a task's exception is raised here."""
    waiting = list(pending)
    try:
        while waiting:
            ready, waiting = ray.wait(waiting, num_returns=1)
            for ref in ready:
                yield pending[ref], ray.get(ref)
    finally:
        for ref in waiting:  # a task failed (or the caller stopped): the rest would run for nothing
            ray.cancel(ref)


_SHARED: dict[str, Any] = {}
"""In a worker process: the reference (hex) and the deserialized value of the current shared object."""


def _run_task(fn: Callable[[Any, Any], Any], box: list[Any], item: Any) -> Any:
    ref = box[0]
    key = ref.hex()
    if _SHARED.get("key") != key:
        _SHARED.clear()  # one map's shared object at a time: memory stays bounded
        _SHARED.update(key=key, value=ray.get(ref))
    return fn(_SHARED["value"], item)


__all__ = ["MAX_RETRIES", "RayExecutor"]
