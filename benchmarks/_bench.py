"""Shared plumbing for the benchmark scripts: the model zoo, measured child processes, RESULTS.md.

Every measured configuration runs in its own child process (ModelOpt patches
``onnxruntime.quantization`` globally, and a fresh process gives each one its own peak RSS).
The parent caps the child's address space with ``RLIMIT_AS``, reads the child's resource usage
with ``os.wait4`` (``ru_maxrss`` is the child's own peak resident set), and turns a non-zero
exit into a classified failure (out of memory, timeout, error) instead of an exception.
"""
from __future__ import annotations

import json
import os
import platform
import resource
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
ZOO = Path(os.environ.get("QDBG_MODELS", "/tmp/qdbg_models"))
PEERS_PYTHON = Path(os.environ.get("QDBG_PEERS_PYTHON", "/work/peers_venv/bin/python"))
QDBG_PYTHON = Path(os.environ.get("QDBG_PYTHON", sys.executable))

# Every library that could spread work over both cores is held to one thread, so each
# configuration uses one core and the ratios do not depend on who else is using the machine's
# other core. ONNX Runtime's own pools are pinned inside the child (pin_ort_threads).
ONE_THREAD_ENV = {k: "1" for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
                                   "NUMBA_NUM_THREADS", "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS")}

OOM_MARKERS = ("MemoryError", "bad_alloc", "Cannot allocate memory", "Failed to allocate",
               "out of memory", "Unable to allocate", "std::length_error")


@dataclass(frozen=True)
class ZooModel:
    """One model of the zoo: where it lives and which inputs its calibration data feeds."""

    name: str
    inputs: tuple[str, ...]

    @property
    def dir(self) -> Path:
        return ZOO / self.name

    @property
    def onnx(self) -> Path:
        return self.dir / "model.onnx"

    @property
    def calib(self) -> Path:
        return self.dir / "calib.npz"


MODELS = {
    "digits_cnn": ZooModel("digits_cnn", ("input",)),
    "resnet50_shape": ZooModel("resnet50_shape", ("input",)),
    "minilm_l6_v2_text": ZooModel("minilm_l6_v2_text", ("input_ids", "attention_mask", "token_type_ids")),
    "silero_vad_16k": ZooModel("silero_vad_16k", ("input", "h", "c")),
}


def calib_subset(model: ZooModel, n: int, dest: Path) -> tuple[Path, int]:
    """Writes the first ``n`` calibration samples of ``model`` to ``dest`` (uncompressed .npz).

    A zoo set smaller than ``n`` is repeated cyclically: the cost of a pass depends on the
    tensor shapes, not on whether a sample was seen before.

    Returns:
        The file and the number of distinct samples in it.
    """
    with np.load(model.calib, allow_pickle=False) as z:
        arrays = {k: z[k] for k in model.inputs}
    have = len(next(iter(arrays.values())))
    idx = np.arange(n) % have
    dest.parent.mkdir(parents=True, exist_ok=True)
    np.savez(dest, **{k: v[idx] for k, v in arrays.items()})
    return dest, min(n, have)


@dataclass
class ChildRun:
    """What one measured child process did."""

    status: str  # "ok", "oom", "timeout", "error"
    wall_s: float  # whole child, interpreter start to exit
    peak_rss_mib: float  # ru_maxrss of the child
    cpu_s: float
    result: dict = field(default_factory=dict)  # what the child reported (work_s, ...)
    error: str = ""
    log: str = ""
    load_before: float = 0.0
    load_after: float = 0.0

    def to_dict(self) -> dict:
        return asdict(self)


def _limit(mem_bytes: int | None):
    def apply() -> None:
        if mem_bytes:
            resource.setrlimit(resource.RLIMIT_AS, (mem_bytes, mem_bytes))
    return apply


def run_child(python: Path, args: list[str], log: Path, mem_gib: float | None, timeout_s: float) -> ChildRun:
    """Runs ``python args...`` under an address-space cap and measures it.

    The child writes its own measurements as JSON to the path given by ``--result``, which is
    appended here.
    """
    log.parent.mkdir(parents=True, exist_ok=True)
    fd, result_path = tempfile.mkstemp(suffix=".json", prefix="child_")
    os.close(fd)
    env = {**os.environ, **ONE_THREAD_ENV, "PYTHONUNBUFFERED": "1"}
    cap = int(mem_gib * 2**30) if mem_gib else None
    load_before = os.getloadavg()[0]
    t0 = time.perf_counter()
    with open(log, "w") as out:
        proc = subprocess.Popen([str(python), *args, "--result", result_path], stdout=out,
                                stderr=subprocess.STDOUT, env=env, preexec_fn=_limit(cap),
                                start_new_session=True, cwd=tempfile.gettempdir())
        status, usage, timed_out = _wait(proc, timeout_s)
    wall = time.perf_counter() - t0
    text = log.read_text(errors="replace")
    try:
        result = json.loads(Path(result_path).read_text() or "{}")
    except json.JSONDecodeError:
        result = {}
    os.unlink(result_path)
    code = os.waitstatus_to_exitcode(status) if status is not None else None
    state, error = _classify(code, timed_out, text, result)
    return ChildRun(state, round(wall, 3), round(usage.ru_maxrss / 1024, 1),
                    round(usage.ru_utime + usage.ru_stime, 2), result, error, str(log),
                    load_before, os.getloadavg()[0])


def _wait(proc: subprocess.Popen, timeout_s: float):
    deadline = time.monotonic() + timeout_s
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            proc.returncode = os.waitstatus_to_exitcode(status)
            return status, usage, False
        if time.monotonic() > deadline:
            os.killpg(proc.pid, signal.SIGKILL)  # the child's own session: only what it started
            _, status, usage = os.wait4(proc.pid, 0)
            proc.returncode = -9
            return status, usage, True
        time.sleep(0.1)


def _classify(code: int | None, timed_out: bool, text: str, result: dict) -> tuple[str, str]:
    if timed_out:
        return "timeout", "exceeded the time limit"
    if code == 0 and result.get("ok"):
        return "ok", ""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    tail = lines[-1] if lines else f"exit status {code}"
    if any(m in text for m in OOM_MARKERS) or code == -9:
        hit = next((ln for ln in reversed(lines) if any(m in ln for m in OOM_MARKERS)), tail)
        at = min((hit.find(m) for m in OOM_MARKERS if m in hit), default=0)
        # keep the start (which op, which library) and the allocation failure itself
        return "oom", hit[:120] + (" ... " + hit[max(at - 40, 120):at + 160] if at > 120 else "")
    err = next((ln for ln in reversed(lines) if "Error" in ln or "error" in ln), tail)
    return "error", err[:300]


def pin_ort_threads() -> None:
    """Makes every ONNX Runtime session of this process use one intra-op and one inter-op thread.

    Patched on the class, so sessions that a library creates internally (the calibrators of ONNX
    Runtime and ModelOpt build their own SessionOptions) are pinned too.
    """
    import onnxruntime as ort
    from onnxruntime.capi import onnxruntime_inference_collection as oic

    original = oic.InferenceSession.__init__

    def init(self, path_or_bytes, sess_options=None, providers=None, provider_options=None, **kw):
        if sess_options is None:
            sess_options = ort.SessionOptions()
        sess_options.intra_op_num_threads = 1
        sess_options.inter_op_num_threads = 1
        original(self, path_or_bytes, sess_options, providers, provider_options, **kw)

    oic.InferenceSession.__init__ = init


def machine() -> dict:
    """CPU, cores, memory, OS and load: the facts a reader needs to weigh the timings."""
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
        mem = next(int(ln.split()[1]) for ln in Path("/proc/meminfo").read_text().splitlines()
                   if ln.startswith("MemTotal"))
    except (OSError, StopIteration):
        mem = 0
    return {"cpu": cpu, "cores": os.cpu_count(), "mem_gib": round(mem / 2**20, 1),
            "os": platform.platform(), "python": platform.python_version(), "loadavg": os.getloadavg()}


def git_commit() -> str:
    try:
        return subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def write_section(md: Path, title: str, body: str) -> None:
    """Replaces the ``## title`` section of ``md`` (or appends it), leaving every other section as is."""
    head = f"## {title}"
    text = md.read_text() if md.exists() else "# Benchmark results\n"
    lines = text.splitlines()
    start = next((i for i, ln in enumerate(lines) if ln.strip() == head), None)
    new = [head, "", *body.strip("\n").splitlines(), ""]
    if start is None:
        lines = [*lines, "", *new] if lines and lines[-1].strip() else [*lines, *new]
    else:
        end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
        lines = [*lines[:start], *new, *lines[end:]]
    tmp = md.with_suffix(".md.tmp")
    tmp.write_text("\n".join(lines).rstrip("\n") + "\n")
    os.replace(tmp, md)
