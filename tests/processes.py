"""Waiting on processes in tests: for a file a process writes, and for a process to be gone.

Both wait for an event and give up only after a generous limit (a loaded machine is slow, not
wrong). ``gone`` reads ``/proc``, so the tests that use it run on Linux only (``LINUX_ONLY``).
"""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

LINUX_ONLY = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="process supervision is checked through /proc, which only Linux has")

PATIENCE = 60.0
"""Seconds before a wait gives up: long enough for any loaded machine, reached only by a failure."""


def wait_for_file(path: Path, process: subprocess.Popen | None = None) -> str:
    """Returns the text of ``path`` once it exists (written whole, by rename), while ``process`` runs."""
    limit = time.monotonic() + PATIENCE
    while not path.exists():
        if process is not None and process.poll() is not None:
            raise AssertionError(f"the process ended ({process.returncode}) before writing {path.name}: "
                                 f"{process.communicate()}")
        assert time.monotonic() < limit, f"{path.name} not written after {PATIENCE} s"
        time.sleep(0.02)
    return path.read_text()


def _state(pid: int) -> str | None:
    """The process's state letter from /proc (None: no such process)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return None


def gone(pid: int) -> bool:
    """True once ``pid`` has stopped: no such process, or dead and waiting to be reaped (state Z)."""
    limit = time.monotonic() + PATIENCE
    while _state(pid) not in (None, "Z"):
        if time.monotonic() > limit:
            return False
        time.sleep(0.02)
    return True


def running(pid: int) -> bool:
    """True while ``pid`` exists and has not died (so a later ``gone`` means something)."""
    return _state(pid) not in (None, "Z")
