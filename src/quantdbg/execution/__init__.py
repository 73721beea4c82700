"""Where independent tasks run: this machine (the default) or a Ray cluster, behind one protocol.

:class:`LocalExecutor` runs tasks serially or in forked processes; :class:`RayExecutor` (extra
``ray``, imported on first use) runs them as Ray tasks on a local instance or a cluster.
"""
from quantdbg.execution.base import Executor
from quantdbg.execution.local import LocalExecutor
from quantdbg.execution.ray_executor import RayExecutor

__all__ = ["Executor", "LocalExecutor", "RayExecutor"]
