"""The Ray tests: one local Ray instance of two CPUs per test module.

Every module starts with ``pytest.importorskip("ray")`` (the ``[dev]`` extra installs it) and asks
for ``ray_instance``, which starts Ray once for the module and shuts it down after it; except
``test_no_shared_fs.py``, whose two-node cluster (``noshare.py``) hides the driver's files from the
worker node.
"""
from __future__ import annotations

import os

import pytest


@pytest.fixture(scope="module")
def ray_instance():
    import ray

    # Workers keep the driver's priority: on a loaded machine niced workers can starve.
    os.environ.setdefault("RAY_worker_niceness", "0")
    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR", log_to_driver=False,
             configure_logging=False)
    try:
        yield ray
    finally:
        ray.shutdown()
