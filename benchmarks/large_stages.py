"""Peak RSS per ONNX Runtime session of one ``quantdbg`` command, to see where a run's memory goes.

Runs the command in this process with a thread sampling RSS every 10 ms; each session's creation and
life (until it is closed) is a stage, named by the quantdbg functions that opened it. The last line
is the process's peak RSS (``ru_maxrss``), as ``/usr/bin/time -v`` reports it.

  python benchmarks/large_stages.py analyze MODEL --data CALIB.npz --eval EVAL.npz --mode local -o OUT.json
"""
from __future__ import annotations

import resource
import sys
import threading
import time
import traceback

import psutil

from quantdbg.backends import onnxrt
from quantdbg.cli import main as cli

_PROCESS = psutil.Process()
_STATE: dict[str, str] = {"stage": "before any session"}
_PEAKS: dict[str, int] = {}


def _sample() -> None:
    while True:
        stage = _STATE["stage"]
        _PEAKS[stage] = max(_PEAKS.get(stage, 0), _PROCESS.memory_info().rss)
        time.sleep(0.01)


def _opener() -> str:
    frames = [f.name for f in traceback.extract_stack()[:-3]
              if "quantdbg" in f.filename and "backends" not in f.filename]
    return "/".join(frames[-3:])


def _instrument() -> None:
    runner = onnxrt.OnnxrtRunner
    activate, deactivate = runner._activate, runner._deactivate
    count = iter(range(1, 10**6))

    def _activate(self: onnxrt.OnnxrtRunner) -> None:
        stage = f"{next(count)}: {_opener()}"
        _STATE["stage"] = f"{stage} (create)"
        activate(self)
        _STATE["stage"] = f"{stage} (open)"

    def _deactivate(self: onnxrt.OnnxrtRunner) -> None:
        deactivate(self)
        _STATE["stage"] = "between sessions (largest gap)"

    runner._activate, runner._deactivate = _activate, _deactivate


def main(argv: list[str]) -> int:
    threading.Thread(target=_sample, daemon=True).start()
    _instrument()
    status = cli(argv)
    time.sleep(0.05)
    for stage, peak in _PEAKS.items():
        print(f"{peak / 2**30:6.2f} GiB  {stage}")
    print(f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:6.2f} GiB  peak RSS")
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
