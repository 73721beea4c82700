"""Tasks on a Ray cluster: ``shared`` goes to the object store once, every item is a Ray task.

Ray is imported on first use (extra ``ray``). ``shared`` is packed (:mod:`quantdbg.execution.shipping`)
and put in the object store once per :meth:`RayExecutor.map` (NumPy arrays inside it are then read
zero-copy by workers on the same node); each task carries only a reference to it and its own small
item. When the cluster has nodes besides the driver's, the files ``shared`` reads on the driver's
disk (a model's external data, an evaluation command's files) travel too: put once per executor,
written once per node into its temporary folder. A worker process keeps the unpacked ``shared`` of
the current map, so objects that open a session on first use open it once per worker, not once per
task. A task whose worker dies is run again (``max_retries``); a task's quantdbg error is raised on
the driver as itself (one line for the CLI), other errors as Ray's wrapper with the remote traceback.
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from quantdbg import _optional
from quantdbg._progress import track
from quantdbg.errors import ConfigError, QuantDbgError
from quantdbg.execution import node_cache
from quantdbg.execution.base import OnResult
from quantdbg.execution.shipping import Packer, Parcel, pack, unpack

logger = logging.getLogger(__name__)

ray = _optional.lazy_import("ray", "ray")

T = TypeVar("T")
R = TypeVar("R")

MAX_RETRIES = 3
"""Default number of times a task whose worker died is run again."""


@dataclass(frozen=True)
class Shipment:
    """What one :meth:`RayExecutor.map` sent through the object store, in bytes.

    Attributes:
        tasks: Tasks run.
        shared: The packed ``shared`` object: put once; each node that runs a task pulls it once.
        files: Files of the driver's disk that ``shared`` reads (model data files, an evaluation
            command's files); each other node that runs a task pulls them once and keeps them in its
            temporary folder. 0 when every worker runs on the driver's node (they read them in place).
        new_files: Of ``files``, the bytes this map put (the rest an earlier map of the executor put).
        per_task: The largest task's own arguments: the function's reference, its item and the
            shared object's reference.
    """

    tasks: int
    shared: int
    files: int
    new_files: int
    per_task: int


class RayExecutor:
    """Runs tasks as Ray tasks, one CPU each.

    Args:
        address: The cluster to join: None starts a local Ray instance (or uses the one this
            process already initialised), ``"auto"`` joins the cluster started on this machine
            with ``ray start``, ``"HOST:PORT"`` joins that head node.
        max_retries: Times a task whose worker died is run again.

    Attributes:
        shipments: What each map sent through the object store, in order (:class:`Shipment`).

    Raises:
        ConfigError: ``max_retries`` below 0.
        MissingDependencyError: Ray is not installed (``pip install 'quantdbg[ray]'``), at first use.
    """

    def __init__(self, address: str | None = None, *, max_retries: int = MAX_RETRIES) -> None:
        if max_retries < 0:
            raise ConfigError(f"max_retries must be >= 0, got {max_retries}.")
        self.address = address
        self.max_retries = max_retries
        self.shipments: list[Shipment] = []
        self._files: dict[tuple[str, int, int], tuple[str, tuple[Any, ...]]] = {}
        """The driver's files put so far: ``(path, size, mtime) -> (digest, piece references)``."""

    def __getstate__(self) -> dict[str, Any]:
        """A copy elsewhere starts without this driver's object-store references."""
        return {**self.__dict__, "_files": {}}

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
        box = [self._put(shared, fn, items)]
        task = ray.remote(num_cpus=1, max_retries=self.max_retries)(_run_task)
        pending = {task.remote(fn, box, item): index for index, item in enumerate(items)}
        found: dict[int, R] = {}
        for index, result in track(_as_completed(pending), total=len(items), desc=desc, enabled=progress,
                                   unit="task"):
            found[index] = result
            if on_result is not None:
                on_result(index, result)
        return [found[i] for i in range(len(items))]

    def _put(self, shared: Any, fn: Callable[..., Any], items: list[Any]) -> Any:
        """Packs ``shared`` (with the driver's files it reads when other nodes may run tasks), puts it
        in the object store and notes the bytes in :attr:`shipments`."""
        node = ray.get_runtime_context().get_node_id()
        packer = Packer(ray.put if _other_nodes(node) else None, node, self._files)
        parcel = pack(shared, packer)
        ref = ray.put(parcel)
        per_task = max(len(ray.cloudpickle.dumps((fn, item))) for item in items) + len(ref.binary())
        files = sum(folder.nbytes for folder in parcel.folders) if packer.put is not None else 0
        self.shipments.append(Shipment(len(items), parcel.nbytes, files, packer.new_bytes, per_task))
        logger.info("sent %d tasks: the shared object %d bytes, files %d bytes (%d new), at most %d bytes "
                    "per task", len(items), parcel.nbytes, files, packer.new_bytes, per_task)
        return ref


def _other_nodes(node: str) -> bool:
    """True when a live node other than ``node`` can run tasks."""
    return any(info["Alive"] and info["NodeID"] != node and info["Resources"].get("CPU", 0) > 0
               for info in ray.nodes())


def _as_completed(pending: dict[Any, int]) -> Any:
    """Yields (index, result) as the tasks finish; a task's exception is raised here."""
    waiting = list(pending)
    try:
        while waiting:
            ready, waiting = ray.wait(waiting, num_returns=1)
            for ref in ready:
                yield pending[ref], _result(ref)
    finally:
        for ref in waiting:  # a task failed (or the caller stopped): the rest would run for nothing
            ray.cancel(ref)


def _result(ref: Any) -> Any:
    """A task's result; the quantdbg error it raised comes as itself (its message is for the user)."""
    try:
        return ray.get(ref)
    except ray.exceptions.RayTaskError as err:
        if isinstance(err.cause, QuantDbgError):
            raise err.cause from err
        raise


_SHARED: dict[str, Any] = {}
"""In a worker process: the reference (hex), the unpacked value of the current shared object and the
node's cached folders it reads."""


def _run_task(fn: Callable[[Any, Any], Any], box: list[Any], item: Any) -> Any:
    ref = box[0]
    key = ref.hex()
    if _SHARED.get("key") != key:
        _SHARED.clear()  # one map's shared object at a time: memory stays bounded
        parcel: Parcel = ray.get(ref)
        value, folders = unpack(parcel, ray.get, ray.get_runtime_context().get_node_id())
        _SHARED.update(key=key, value=value, folders=folders)
    node_cache.touch(_SHARED["folders"])
    return fn(_SHARED["value"], item)


__all__ = ["MAX_RETRIES", "RayExecutor", "Shipment"]
