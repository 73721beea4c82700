"""Tasks on this machine: one after another, or in forked worker processes (``jobs > 1``)."""
from __future__ import annotations

import logging
import multiprocessing
import os
import pickle
import signal
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from typing import Any, TypeVar

from quantdbg._progress import track
from quantdbg.errors import ConfigError
from quantdbg.execution.base import OnResult
from quantdbg.execution.supervisor import die_with_parent

logger = logging.getLogger(__name__)

T = TypeVar("T")
R = TypeVar("R")


class LocalExecutor:
    """Runs tasks here: serially (``jobs=1``, the default) or in ``jobs`` forked processes.

    A forked worker gets ``shared`` once, as a pickled copy (so an object drops what must not cross
    a fork, such as an open session, through its ``__getstate__``).

    Args:
        jobs: Worker processes (1: run in this process).

    Raises:
        ConfigError: ``jobs`` below 1.
    """

    def __init__(self, jobs: int = 1) -> None:
        if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
            raise ConfigError(f"LocalExecutor jobs must be an integer >= 1, got {jobs!r}.")
        self.jobs = jobs

    def workers(self) -> int:
        """The number of worker processes."""
        return self.jobs

    def __repr__(self) -> str:
        return f"LocalExecutor(jobs={self.jobs})"

    def map(self, fn: Callable[[Any, T], R], items: Sequence[T], *, shared: Any = None,
            on_result: OnResult | None = None, desc: str = "tasks", progress: bool = False) -> list[R]:
        """Runs ``fn(shared, item)`` for every item (see :class:`~quantdbg.execution.Executor`)."""
        items = list(items)
        found: dict[int, R] = {}
        done = self._run(fn, items, shared)
        for index, result in track(done, total=len(items), desc=desc, enabled=progress, unit="task"):
            found[index] = result
            if on_result is not None:
                on_result(index, result)
        return [found[i] for i in range(len(items))]

    def _run(self, fn: Callable[[Any, T], R], items: list[T], shared: Any) -> Iterator[tuple[int, R]]:
        forkable = "fork" in multiprocessing.get_all_start_methods()
        if self.jobs == 1 or len(items) < 2 or not forkable:
            if self.jobs > 1 and not forkable:
                logger.warning("jobs=%d needs the 'fork' start method, absent here; running serially.",
                               self.jobs)
            for index, item in enumerate(items):
                yield index, fn(shared, item)
            return
        context = multiprocessing.get_context("fork")
        with ProcessPoolExecutor(min(self.jobs, len(items)), mp_context=context, initializer=_worker_init,
                                 initargs=(pickle.dumps(shared), os.getpid())) as pool:
            futures = {pool.submit(_worker_run, fn, item): index for index, item in enumerate(items)}
            for future in as_completed(futures):
                yield futures[future], future.result()


_WORKER: dict[str, Any] = {}


def _worker_init(shared: bytes, parent: int) -> None:
    # A worker dies with the process that forked it, SIGKILL included, so that what a task started
    # (an evaluation command under its supervisor) goes too.
    die_with_parent(signal.SIGKILL)
    if os.getppid() != parent:
        os._exit(1)  # the parent died before the signal was armed
    _WORKER["shared"] = pickle.loads(shared)


def _worker_run(fn: Callable[[Any, Any], Any], item: Any) -> Any:
    return fn(_WORKER["shared"], item)


__all__ = ["LocalExecutor"]
