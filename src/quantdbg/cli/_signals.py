"""SIGINT and SIGTERM stop a command with one line and the shell's status (130, 143).

While a command runs, both signals raise :class:`Stopped` in the main thread, so ``finally`` blocks
and context managers run: the evaluation command's process group is killed, temporary folders are
removed, and the journal of a command that resumes (``analyze``, ``fallback``, ``auto``) stays for the
next run to resume from.
"""
from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType

from quantdbg.cli._resume import RESUMING

_HANDLED = (signal.SIGINT, signal.SIGTERM)


class Stopped(BaseException):
    """The command was stopped by a signal (a BaseException, so no ``except Exception`` swallows it).

    Attributes:
        signum: The signal.
        status: The exit status a shell reports for it (128 + signal number).
    """

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum
        self.status = 128 + signum


def _raise(signum: int, frame: FrameType | None) -> None:
    raise Stopped(signum)


@contextlib.contextmanager
def stop_on_signals() -> Iterator[None]:
    """Within the block, SIGINT and SIGTERM raise :class:`Stopped` (Ctrl-C too, instead of a
    KeyboardInterrupt traceback); the previous handlers come back afterwards. Outside the main
    thread, where handlers cannot be installed, nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {signum: signal.signal(signum, _raise) for signum in _HANDLED}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def message(stop: Stopped, command: str) -> str:
    """The one line printed for a stopped command: a command that keeps a journal resumes, the others
    start over."""
    name = signal.Signals(stop.signum).name
    if command in RESUMING:
        return f"quantdbg {command}: stopped by {name}; rerun the same command to resume where it stopped.\n"
    return f"quantdbg {command}: stopped by {name}; rerun the command to start over (it does not resume).\n"
