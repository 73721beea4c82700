"""External commands (the ``--evaluate`` command) that take everything they started along when they stop.

Linux's parent-death signal reaches only a direct child: a command started by quantdbg could die
with a SIGKILLed quantdbg, but the processes *it* started (a shell's background job, a data loader's
workers) would run on. So each command runs under a small supervisor process
(:mod:`quantdbg.execution.supervisor`) that starts it in a process group of its own and kills the
whole group when the command exits, when the run stops early, and when this process dies.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Sequence

from quantdbg.execution import supervisor


def run_in_own_group(argv: Sequence[str], timeout: float | None,
                     cwd: str | os.PathLike | None) -> subprocess.CompletedProcess[str]:
    """Runs ``argv`` under a supervisor, in a process group of its own, and returns what it printed.

    Nothing the command started outlives the run: its group is killed when the command exits, when
    the wait ends early (a timeout, Ctrl-C, SIGTERM), and when this process dies, SIGKILL included.

    Args:
        argv: The program and its arguments (no shell).
        timeout: Seconds to wait before the group is killed (None: no limit).
        cwd: Working directory of the command (None: this process's).

    Returns:
        The command's exit status (negative: killed by that signal), stdout and stderr, as text.

    Raises:
        subprocess.TimeoutExpired: ``timeout`` passed (the group is killed first).
        OSError: The program cannot be started (``FileNotFoundError``, ``PermissionError``, ...).
        ChildProcessError: The supervisor ended without reporting the command's status.
    """
    ours, theirs = socket.socketpair()
    with ours:
        with theirs:
            start = [sys.executable, "-I", "-S", os.path.abspath(supervisor.__file__), str(os.getpid()),
                     str(theirs.fileno()), *argv]
            process = subprocess.Popen(start, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                       cwd=cwd, pass_fds=(theirs.fileno(),))
        try:
            out, err = process.communicate(timeout=timeout)
        except BaseException:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)  # the supervisor kills the group, then exits
            process.communicate()
            raise
        message = _received(ours)
    return subprocess.CompletedProcess(list(argv), _status(message, process, argv[0], err), out, err)


def _received(channel: socket.socket) -> str:
    """What the supervisor sent (it has exited, so all of it is buffered)."""
    channel.setblocking(False)  # a forked sibling may hold the other end open: never wait for its EOF
    chunks = []
    try:
        while chunk := channel.recv(4096):
            chunks.append(chunk)
    except BlockingIOError:
        pass
    return b"".join(chunks).decode()


def _status(message: str, process: subprocess.Popen[str], program: str, stderr: str) -> int:
    kind, _, value = message.partition(" ")
    if kind == supervisor.EXIT:
        return int(value)
    if kind == supervisor.OSERROR:
        number, _, text = value.partition(" ")
        raise OSError(int(number), text, program)  # the errno picks the subclass (FileNotFoundError, ...)
    tail = stderr.strip().splitlines()[-1:] or ["no output"]
    raise ChildProcessError(f"its supervisor process ended with status {process.returncode} before "
                            f"reporting the command's status ({tail[0]})")


__all__ = ["run_in_own_group"]
