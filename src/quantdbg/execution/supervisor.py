"""The supervisor of one command, run as a script by :func:`quantdbg.execution.command.run_in_own_group`::

    python -I -S supervisor.py CALLER_PID CHANNEL_FD PROGRAM [ARGUMENT...]

It starts the command in a session (and process group) of its own, and kills that whole group with
SIGKILL when the command exits (what it left running goes too), on SIGTERM (the caller stopping the
run), and when the caller dies: the caller's end of the channel, a socket, closes; on Linux the
parent-death signal arrives too (also when a forked sibling of the caller holds a copy of that end).
On Linux it is also the reaper of its orphaned descendants (``PR_SET_CHILD_SUBREAPER``), so what
left the group for a session of its own (``setsid``, as a daemon does) is adopted once its parent
dies and killed with the group; else it would outlive the run and hold the caller's pipes open.
Then it writes one message to the channel: ``exit STATUS`` (negative: the signal that killed the
command), or ``oserror ERRNO TEXT`` when the program could not be started.

The command inherits the supervisor's standard streams, which are the caller's pipes. The script
imports only modules the interpreter needs anyway (os, signal, sys, threading, time; ctypes on Linux), so
the supervisor costs one interpreter start-up and no folder, ``PYTHONPATH`` or site package can
stand in for one of them.
"""
from __future__ import annotations

import os
import signal
import sys
import threading
import time

EXIT = "exit"
"""Message kind: the command ran; the value is its exit status (negative: killed by that signal)."""

OSERROR = "oserror"
"""Message kind: the program could not be started; the values are the errno and its text."""

_TERMINAL_SIGNALS = (signal.SIGINT, signal.SIGQUIT, signal.SIGHUP)
"""Ctrl-C, Ctrl-\\\\ and a hangup reach the terminal's whole foreground group, the supervisor with its
caller. The supervisor outlives them and leaves the decision to the caller, which stops the run
(SIGTERM) or dies of the signal (then the parent-death path stops the group)."""

_RESTORED_SIGNALS = tuple(getattr(signal, name) for name in ("SIGPIPE", "SIGXFZ", "SIGXFSZ")
                          if hasattr(signal, name))
"""Python ignores these at start-up; the command gets their default action back (as subprocess does)."""


class _Group:
    """The command's process group. Signal handlers and the channel watcher may stop it at any
    time, before the command has started too: whichever of ``stop`` and ``started`` comes second
    sees the other's mark and kills the group."""

    def __init__(self) -> None:
        self.stopping = False
        self.pid: int | None = None

    def stop(self, *_: object) -> None:
        self.stopping = True
        self.kill()

    def started(self, pid: int) -> None:
        self.pid = pid
        if self.stopping:
            self.kill()

    def kill(self) -> None:
        if self.pid is not None:
            self.kill_group(self.pid)

    @staticmethod
    def kill_group(group: int) -> None:
        try:
            os.killpg(group, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass  # the group is empty already


def _ignore(*_: object) -> None:
    pass


def _adopt_orphans() -> None:
    """Asks Linux to make this process the parent of every orphan among its descendants (nothing
    elsewhere), so that one that left the group (``setsid``, as a daemon does) is still found."""
    if sys.platform.startswith("linux"):
        import ctypes

        set_child_subreaper = 36  # PR_SET_CHILD_SUBREAPER
        ctypes.CDLL(None, use_errno=True).prctl(set_child_subreaper, 1)


def _left(command: int) -> tuple[bool, list[int]]:
    """Whether a process of the command's group still runs, and this process's children but the
    command (read from /proc on Linux; elsewhere nothing is found)."""
    me, running, adopted = os.getpid(), False, []
    try:
        entries = [entry for entry in os.listdir("/proc") if entry.isdigit()]
    except OSError:
        return False, []
    for entry in entries:
        try:
            with open(f"/proc/{entry}/stat", "rb") as stat:
                state, parent, group = stat.read().rsplit(b")", 1)[1].split()[:3]
        except (OSError, ValueError):
            continue  # gone meanwhile
        running = running or (int(group) == command and state != b"Z")
        if int(parent) == me and int(entry) != command:
            adopted.append(int(entry))
    return running, adopted


_GIVE_UP = 10.0
"""Seconds after which what could not be killed (a process of another user) is left alone."""


def _kill_adopted(command: int) -> None:
    """Once the group is killed, kills and reaps what left it and was adopted (its parent died), until
    the group is gone and nothing more arrives."""
    deadline = time.monotonic() + _GIVE_UP
    while time.monotonic() < deadline:
        running, adopted = _left(command)
        if not running and not adopted:
            return
        for pid in adopted:
            try:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            except (ProcessLookupError, ChildProcessError, PermissionError):
                pass
        if running:  # killed, not yet gone (or forked as the group was killed)
            _Group.kill_group(command)
        time.sleep(0.01)


def die_with_parent(signum: int) -> None:
    """Asks Linux to send this process ``signum`` when its parent dies (nothing elsewhere).

    The parent may have died already: compare ``os.getppid()`` with its id afterwards.
    """
    if sys.platform.startswith("linux"):
        import ctypes

        set_parent_death_signal = 1  # PR_SET_PDEATHSIG
        ctypes.CDLL(None, use_errno=True).prctl(set_parent_death_signal, int(signum))


def _watch(channel: int, group: _Group) -> None:
    """Stops the group once the caller's end of the channel closes: the caller has died."""
    try:
        while os.read(channel, 64):
            pass
    except OSError:
        pass
    group.stop()


def _send(channel: int, kind: str, *values: object) -> None:
    try:
        os.write(channel, " ".join(map(str, (kind, *values))).encode())
    except OSError:
        pass  # the caller is gone: nobody to tell


def _start(argv: list[str], group: _Group, channel: int) -> int | None:
    try:
        pid = os.posix_spawnp(argv[0], argv, dict(os.environ), setsid=True, setsigdef=_RESTORED_SIGNALS)
    except OSError as err:
        _send(channel, OSERROR, err.errno, err.strerror)
        return None
    group.started(pid)
    return pid


def supervise(caller: int, channel: int, argv: list[str]) -> None:
    """Runs ``argv`` as described in the module docstring.

    Args:
        caller: The process id of the caller (the expected parent).
        channel: The file descriptor of the supervisor's end of the channel.
        argv: The command.
    """
    group = _Group()
    signal.signal(signal.SIGTERM, group.stop)
    for signum in _TERMINAL_SIGNALS:
        signal.signal(signum, _ignore)  # a handler, not SIG_IGN: exec resets it for the command
    os.set_inheritable(channel, False)  # the command must not hold the channel open
    die_with_parent(signal.SIGTERM)
    _adopt_orphans()
    if os.getppid() != caller:  # the caller died before the parent-death signal was armed
        return
    threading.Thread(target=_watch, args=(channel, group), daemon=True).start()
    pid = None if group.stopping else _start(argv, group, channel)
    if pid is None:
        return
    # Wait without reaping: the group's id cannot be reused before what the command left is killed.
    os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
    group.kill()
    _kill_adopted(pid)
    _send(channel, EXIT, os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))


if __name__ == "__main__":
    supervise(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3:])
