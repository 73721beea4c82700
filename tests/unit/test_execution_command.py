"""run_in_own_group: nothing an external command started outlives the run, however the run ends.

Each command is a shell that starts a grandchild (``sleep``) and writes both process ids; the tests
end the run in every way it can end and then check, through /proc, that both processes are gone.
"""
from __future__ import annotations

import os
import shlex
import signal
import socket
import subprocess
import sys
import threading

import pytest
from processes import LINUX_ONLY, PATIENCE, gone, running, wait_for_file

from quantdbg.execution import supervisor
from quantdbg.execution.command import run_in_own_group

pytestmark = LINUX_ONLY

SPAWN = 'sleep 1000 & echo "$$ $!" > pids.tmp && mv pids.tmp pids; wait'
"""The command: a shell whose background job is the grandchild; it writes 'SHELL_PID SLEEP_PID'."""

CALLER = """\
import sys
from quantdbg.execution.command import run_in_own_group
run_in_own_group(["sh", "-c", sys.argv[1]], None, None)
"""

FORKING_CALLER = """\
import os, sys, threading, time
from quantdbg.execution.command import run_in_own_group

def fork_once_started():
    while not os.path.exists("pids"):
        time.sleep(0.01)
    if os.fork() == 0:  # a sibling holding a copy of every descriptor, the caller's end of the channel too
        with open("sibling.tmp", "w") as f:
            f.write(str(os.getpid()))
        os.rename("sibling.tmp", "sibling")
        time.sleep(1000)
        os._exit(0)

threading.Thread(target=fork_once_started, daemon=True).start()
run_in_own_group(["sh", "-c", sys.argv[1]], None, None)
"""


WORKERS_CALLER = """\
import os, sys
from quantdbg.execution import LocalExecutor
from quantdbg.execution.command import run_in_own_group

def evaluate(script, index):
    with open(f"worker{index}.tmp", "w") as f:
        f.write(str(os.getpid()))
    os.rename(f"worker{index}.tmp", f"worker{index}")
    return run_in_own_group(["sh", "-c", script.replace("pids", f"pids{index}")], None, None).returncode

LocalExecutor(2).map(evaluate, [0, 1], shared=sys.argv[1])
"""


_LEAVE = ('import os, time; os.setsid(); open("pids.tmp", "w").write(f"{os.getppid()} {os.getpid()}"); '
          f'os.rename("pids.tmp", "pids"); time.sleep({2 * PATIENCE})')
DAEMON = f"{shlex.quote(sys.executable)} -c {shlex.quote(_LEAVE)} & "
"""A grandchild that leaves the command's group for a session of its own (as a daemon does), then
writes 'SHELL_PID DAEMON_PID'; it keeps the shell's stdout and stderr, the caller's pipes (so a
failing test waits for it; it sleeps only twice the patience)."""


def _pids(folder, process, leftovers, name="pids") -> tuple[int, int]:
    child, grandchild = map(int, wait_for_file(folder / name, process).split())
    leftovers += [child, grandchild]
    assert running(child) and running(grandchild)
    return child, grandchild


def test_a_sigkilled_caller_takes_the_grandchildren_along(tmp_path, leftovers):
    caller = subprocess.Popen([sys.executable, "-c", CALLER, SPAWN], cwd=tmp_path)
    child, grandchild = _pids(tmp_path, caller, leftovers)
    caller.kill()
    caller.wait()
    assert gone(child) and gone(grandchild)


def test_a_grandchild_that_left_the_group_goes_too_when_the_caller_is_killed(tmp_path, leftovers):
    caller = subprocess.Popen([sys.executable, "-c", CALLER, DAEMON + "wait"], cwd=tmp_path)
    shell, daemon = _pids(tmp_path, caller, leftovers)
    caller.kill()
    caller.wait()
    assert gone(shell) and gone(daemon)


def test_a_grandchild_that_left_the_group_holding_the_output_goes_when_the_command_exits(tmp_path, leftovers):
    """Else the wait for the end of the output would last as long as that grandchild."""
    script = DAEMON + "while [ ! -e pids ]; do sleep 0.05; done; echo 0.5"
    done = run_in_own_group(["sh", "-c", script], PATIENCE, tmp_path)
    shell, daemon = map(int, (tmp_path / "pids").read_text().split())
    leftovers.append(daemon)
    assert (done.returncode, done.stdout) == (0, "0.5\n")
    assert gone(daemon)


def test_a_sigkilled_caller_takes_the_grandchildren_of_its_forked_workers_along(tmp_path, leftovers):
    """Commands run by LocalExecutor's workers: the workers die with the caller, their supervisors
    with them."""
    caller = subprocess.Popen([sys.executable, "-c", WORKERS_CALLER, SPAWN], cwd=tmp_path)
    started = [_pids(tmp_path, caller, leftovers, f"pids{index}") for index in (0, 1)]
    workers = [int(wait_for_file(tmp_path / f"worker{index}", caller)) for index in (0, 1)]
    leftovers += workers
    caller.kill()
    caller.wait()
    assert all(gone(pid) for pid in workers)
    assert all(gone(pid) for pids in started for pid in pids)


def test_the_parent_death_signal_stops_the_group_when_a_sibling_keeps_the_channel_open(tmp_path, leftovers):
    """The caller's forked sibling holds the caller's end of the channel, so no end-of-file reaches
    the supervisor: the parent-death signal alone must stop the group."""
    caller = subprocess.Popen([sys.executable, "-c", FORKING_CALLER, SPAWN], cwd=tmp_path)
    child, grandchild = _pids(tmp_path, caller, leftovers)
    leftovers.append(int(wait_for_file(tmp_path / "sibling", caller)))
    caller.kill()
    caller.wait()
    assert gone(child) and gone(grandchild)
    assert running(leftovers[-1])  # the sibling lives on: the channel stayed open


def test_ctrl_c_on_the_callers_group_stops_the_command(tmp_path, leftovers):
    """Ctrl-C reaches the terminal's foreground group: the caller and the supervisor, not the command.
    The supervisor outlives it and kills the group when the caller stops."""
    caller = subprocess.Popen([sys.executable, "-c", CALLER, SPAWN], cwd=tmp_path, start_new_session=True,
                              stderr=subprocess.PIPE, text=True)
    child, grandchild = _pids(tmp_path, caller, leftovers)
    os.killpg(caller.pid, signal.SIGINT)
    _, err = caller.communicate(timeout=PATIENCE)
    assert err.rstrip().endswith("KeyboardInterrupt")
    assert gone(child) and gone(grandchild)


def test_a_timeout_kills_the_group(tmp_path, leftovers):
    with pytest.raises(subprocess.TimeoutExpired):
        run_in_own_group(["sh", "-c", SPAWN], 4.0, tmp_path)
    child, grandchild = map(int, (tmp_path / "pids").read_text().split())
    leftovers += [child, grandchild]
    assert gone(child) and gone(grandchild)


def test_what_the_command_leaves_running_is_killed_when_it_exits(tmp_path, leftovers):
    script = 'sleep 1000 > /dev/null 2>&1 & echo $! > pid.tmp && mv pid.tmp pid; echo 0.5'
    done = run_in_own_group(["sh", "-c", script], None, tmp_path)
    assert (done.returncode, done.stdout, done.stderr) == (0, "0.5\n", "")
    grandchild = int((tmp_path / "pid").read_text())
    leftovers.append(grandchild)
    assert gone(grandchild)


def test_status_output_and_start_errors_come_back_as_from_a_plain_child(tmp_path):
    done = run_in_own_group(["sh", "-c", "echo out; echo err >&2; exit 3"], None, None)
    assert (done.args, done.returncode, done.stdout, done.stderr) == (
        ["sh", "-c", "echo out; echo err >&2; exit 3"], 3, "out\n", "err\n")
    assert run_in_own_group(["sh", "-c", "kill -TERM $$"], None, None).returncode == -signal.SIGTERM
    assert run_in_own_group(["sh", "-c", "pwd"], None, tmp_path).stdout == f"{tmp_path}\n"
    with pytest.raises(FileNotFoundError) as missing:
        run_in_own_group([str(tmp_path / "absent"), "x"], None, None)
    assert missing.value.filename == str(tmp_path / "absent")
    (tmp_path / "plain.sh").write_text("echo 1\n")
    with pytest.raises(PermissionError):
        run_in_own_group([str(tmp_path / "plain.sh")], None, None)


def _supervisor(folder, caller: int, *argv: str) -> tuple[subprocess.Popen, socket.socket]:
    """Starts the supervisor directly, as a child of this test, and returns it with our channel end."""
    ours, theirs = socket.socketpair()
    with theirs:
        process = subprocess.Popen([sys.executable, "-I", "-S", supervisor.__file__, str(caller),
                                    str(theirs.fileno()), *argv], cwd=folder, pass_fds=(theirs.fileno(),))
    return process, ours


def test_the_group_is_killed_when_the_callers_end_of_the_channel_closes(tmp_path, leftovers):
    """The portable path: no parent-death signal is involved, this test (the parent) stays alive."""
    process, ours = _supervisor(tmp_path, os.getpid(), "sh", "-c", SPAWN)
    child, grandchild = _pids(tmp_path, process, leftovers)
    ours.close()
    assert process.wait(timeout=PATIENCE) == 0
    assert gone(child) and gone(grandchild)


def test_sigterm_kills_the_group_and_reports_the_kill(tmp_path, leftovers):
    process, ours = _supervisor(tmp_path, os.getpid(), "sh", "-c", SPAWN)
    with ours:
        child, grandchild = _pids(tmp_path, process, leftovers)
        process.terminate()
        assert process.wait(timeout=PATIENCE) == 0
        assert ours.recv(64) == f"exit {-signal.SIGKILL}".encode()
    assert gone(child) and gone(grandchild)


def test_a_caller_that_died_before_the_supervisor_armed_itself_starts_nothing(tmp_path):
    """The supervisor's parent is not the caller it was started for: the caller died and the
    supervisor was handed to another process before it could ask for the parent-death signal."""
    process, ours = _supervisor(tmp_path, os.getppid(), "sh", "-c", "touch started")
    with ours:
        assert process.wait(timeout=PATIENCE) == 0
        assert ours.recv(64) == b""
    assert not (tmp_path / "started").exists()


def test_a_supervisor_killed_outright_is_an_error_not_a_status(tmp_path, leftovers):
    raised: list[BaseException] = []

    def run() -> None:
        try:
            command = 'echo "$PPID" > ppid.tmp && mv ppid.tmp ppid; ' + SPAWN
            run_in_own_group(["sh", "-c", command], None, tmp_path)
        except BaseException as err:  # noqa: BLE001 -- handed to the test thread
            raised.append(err)

    thread = threading.Thread(target=run)
    thread.start()
    child, grandchild = _pids(tmp_path, None, leftovers)
    os.kill(int(wait_for_file(tmp_path / "ppid")), signal.SIGKILL)
    os.killpg(child, signal.SIGKILL)  # the supervisor cannot any more; its pipes close when the group dies
    thread.join(PATIENCE)
    assert [type(e) for e in raised] == [ChildProcessError]
    assert str(raised[0]).startswith(f"its supervisor process ended with status {-signal.SIGKILL} before "
                                     "reporting the command's status")
