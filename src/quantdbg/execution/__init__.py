"""Where independent tasks run: this machine (the default) or a Ray cluster, behind one protocol.

:class:`LocalExecutor` runs tasks serially or in forked processes; :class:`RayExecutor` (extra
``ray``, imported on first use) runs them as Ray tasks on a local instance or a cluster, whose nodes
need not share the driver's disk (:mod:`~quantdbg.execution.shipping` sends the files tasks read).
"""
from quantdbg._exports import public_names as _public_names
from quantdbg.execution.base import Executor as Executor
from quantdbg.execution.base import OnResult as OnResult
from quantdbg.execution.base import TaskFunction as TaskFunction
from quantdbg.execution.local import LocalExecutor as LocalExecutor
from quantdbg.execution.ray_executor import RayExecutor as RayExecutor
from quantdbg.execution.ray_executor import Shipment as Shipment

__all__ = _public_names(globals())
