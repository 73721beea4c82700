"""A two-node Ray cluster on this machine whose worker node cannot see the driver's files.

The head node (the driver's) offers no CPU, so every task runs on the worker node, which is started
in a mount namespace of its own (``unshare --mount``) with an empty tmpfs over each folder given as
hidden: the temporary folder (where the tests' and the driver's files live) and the tests folder.
What the worker node still sees is what a real cluster node has installed: Python, quantdbg, Ray.
Both nodes get Ray's temporary folder of their own (the worker's inside its tmpfs), their own ports,
and token authentication when this user has a Ray token (as ``ray start --head`` would). Used by
the tests of ``test_no_shared_fs.py`` and by ``benchmarks/ray.py --no-shared-fs``.
"""
from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
STARTED = "Ray runtime started"
START_SECONDS = 180  # a loaded 2-core machine takes 20-40 s per node


def unshare_refusal() -> str | None:
    """Why this machine cannot hide folders from a process (None: it can): ``unshare --mount`` and a
    tmpfs mounted in the new namespace must both be permitted."""
    if not sys.platform.startswith("linux") or shutil.which("unshare") is None:
        return "no unshare command (Linux only)"
    probe = subprocess.run(["unshare", "--mount", "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"`unshare --mount true` failed: {probe.stderr.strip()}"
    with tempfile.TemporaryDirectory() as scratch:
        probe = subprocess.run(["unshare", "--mount", "--propagation", "private", "mount", "-t", "tmpfs",
                                "tmpfs", scratch], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"mounting a tmpfs inside `unshare --mount` failed: {probe.stderr.strip()}"
    return None


def hidden_folders(*extra: Path) -> list[Path]:
    """The temporary folder, the tests folder and ``extra``: what the worker node must not see."""
    found: list[Path] = []
    for folder in sorted({Path(tempfile.gettempdir()).resolve(), TESTS, *(p.resolve() for p in extra)}):
        if not any(folder.is_relative_to(kept) for kept in found):  # a tmpfs over a parent hides it already
            found.append(folder)
    return found


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _ports() -> list[str]:
    """Ports Ray would otherwise take at fixed defaults (two nodes, and other Ray users, share the host)."""
    names = ("dashboard-agent-listen-port", "dashboard-agent-grpc-port", "runtime-env-agent-port",
             "metrics-export-port")
    return [f"--{name}={_free_port()}" for name in names]


def _auth_mode() -> str:
    """Token authentication when this user has a Ray token (``ray start --head``'s own rule), else none."""
    path = os.environ.get("RAY_AUTH_TOKEN_PATH") or Path.home() / ".ray" / "auth_token"
    return "token" if os.environ.get("RAY_AUTH_TOKEN") or Path(path).is_file() else "disabled"


def _environment() -> dict[str, str]:
    return {**os.environ, "RAY_worker_niceness": "0", "RAY_AUTH_MODE": _auth_mode(),
            "RAY_agent_register_timeout_ms": str(START_SECONDS * 1000)}


def _start(argv: list[str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "wb") as out:
        return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=_environment(),
                                start_new_session=True)  # its own process group: stopped as one


def _wait_started(process: subprocess.Popen[bytes], log: Path, what: str) -> None:
    deadline = time.monotonic() + START_SECONDS
    while STARTED not in log.read_text(errors="replace"):
        if process.poll() is not None or time.monotonic() > deadline:
            tail = "\n".join(log.read_text(errors="replace").splitlines()[-15:])
            raise RuntimeError(f"the {what} did not start:\n{tail}")
        time.sleep(0.5)


def _wait_listening(process: subprocess.Popen[bytes], log: Path, port: int) -> None:
    """Waits for the head's GCS to accept connections: a worker node may join from then on."""
    deadline = time.monotonic() + START_SECONDS
    while True:
        with socket.socket() as probe, contextlib.suppress(OSError):
            probe.connect(("127.0.0.1", port))
            return
        if process.poll() is not None or time.monotonic() > deadline:
            _wait_started(process, log, "head node")  # says why, from the head's log
        time.sleep(0.5)


def _stop(processes: Sequence[subprocess.Popen[bytes]]) -> None:
    """Stops each node's process group: SIGTERM (Ray shuts its processes down), SIGKILL what is left."""
    for process in processes:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
    deadline = time.monotonic() + 5
    for process in processes:
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=max(0.1, deadline - time.monotonic()))
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


@contextlib.contextmanager
def cluster(hidden: Sequence[Path], cpus: int = 2) -> Iterator[str]:
    """Starts the head and the hidden worker node, connects this process (the driver) to them, and
    yields the cluster's address; stops both nodes after."""
    import ray

    ray_cli = str(Path(sys.executable).with_name("ray"))
    scratch = Path(tempfile.mkdtemp(prefix="qd-ray-"))  # short: Ray's socket paths must fit 107 bytes
    port = _free_port()
    address = f"127.0.0.1:{port}"
    head = _start([ray_cli, "start", "--head", "--block", "--num-cpus=0", f"--port={port}",
                   "--include-dashboard=false", "--disable-usage-stats", f"--temp-dir={scratch / 'head'}",
                   *_ports()], scratch / "head.log")
    nodes = [head]
    try:
        _wait_listening(head, scratch / "head.log", port)
        mounts = "".join(f"mkdir -p {shlex.quote(str(f))} && mount -t tmpfs tmpfs {shlex.quote(str(f))} && "
                         for f in hidden)
        start = shlex.join([ray_cli, "start", "--block", f"--address={address}", f"--num-cpus={cpus}",
                            "--disable-usage-stats", *_ports()])
        namespace = ["unshare", "--mount", "--propagation", "private", "sh", "-c", f"{mounts}exec {start}"]
        worker = _start(namespace, scratch / "worker.log")
        nodes.insert(0, worker)
        _wait_started(worker, scratch / "worker.log", "worker node")
        _wait_started(head, scratch / "head.log", "head node")
        _connect(ray, address)
        try:
            _wait_for_cpus(ray, cpus)
            yield address
        finally:
            ray.shutdown()
    finally:
        _stop(nodes)
        shutil.rmtree(scratch, ignore_errors=True)


def _connect(ray, address: str) -> None:
    """``ray.init`` of this cluster, with token authentication on when the nodes have it. Ray reads
    the mode once, at import; its own local ``ray.init`` turns it on the same way."""
    if _auth_mode() == "token":
        os.environ["RAY_AUTH_MODE"] = "token"
        ray._raylet.Config.initialize("")
    ray.init(address=address, logging_level="ERROR", log_to_driver=False, configure_logging=False)


def _wait_for_cpus(ray, cpus: int) -> None:
    deadline = time.monotonic() + START_SECONDS
    while ray.cluster_resources().get("CPU", 0) < cpus:
        if time.monotonic() > deadline:
            raise RuntimeError(f"the cluster offers {ray.cluster_resources().get('CPU', 0)} CPUs, not {cpus}")
        time.sleep(0.5)
