"""Where independent tasks run: this machine (the default) or a Ray cluster, behind one protocol.

:class:`LocalExecutor` runs tasks serially or in forked processes; :class:`RayExecutor` (extra
``ray``, imported on first use) runs them as Ray tasks on a local instance or a cluster, whose nodes
need not share the driver's disk (:mod:`~quantdbg.execution.shipping` sends the files tasks read).
"""
from quantdbg.execution.base import Executor
from quantdbg.execution.local import LocalExecutor
from quantdbg.execution.ray_executor import RayExecutor, Shipment

__all__ = ["Executor", "LocalExecutor", "RayExecutor", "Shipment"]
