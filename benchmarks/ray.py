"""Ray on one machine: isolated sweep and calibration, serial vs a local 2-worker Ray instance.

On the embedded digits CNN (the zoo is not needed): Ray's start-up cost (``ray.init`` plus the
first task, which starts the worker processes), an isolated sensitivity sweep serially (ONNX
Runtime with one thread, and with its default of every core) and as Ray tasks on 2 workers of one
ORT thread each, on two evaluation sets (the 540 held-out samples, and that set tiled until one
evaluation takes over a second), and calibration of 512 samples serially vs 2 shards. Every Ray
result is checked against the serial one (same report ranking and values, same Q/DQ model bytes).
Each timing is the best of ``--repeats`` runs.

    python benchmarks/ray.py                 # measure and write the "Ray" section of RESULTS.md
    python benchmarks/ray.py --no-write --repeats 1
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import importlib.util
import os
import platform
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
# Python puts this script's folder first on sys.path, where this file would shadow the ray package
# (here and in Ray's workers, which inherit the driver's path): take it out before anything imports ray.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]

import numpy as np  # noqa: E402

from quantdbg.backends import OnnxrtRunnerFactory, OrtConfig  # noqa: E402
from quantdbg.config import CalibConfig  # noqa: E402
from quantdbg.demo import load_embedded  # noqa: E402
from quantdbg.execution import RayExecutor  # noqa: E402
from quantdbg.qdq import quantize  # noqa: E402
from quantdbg.sensitivity import SensitivityConfig, analyze_sensitivity  # noqa: E402

WORKERS = 2


def _write_section(key: str, text: str) -> None:
    spec = importlib.util.spec_from_file_location("_zoo_tasks", HERE / "_zoo_tasks.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.write_section(key, text)


def _best(repeats: int, run):
    """(best wall seconds, last result) of ``repeats`` calls of ``run``."""
    times, result = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        result = run()
        times.append(time.perf_counter() - start)
    return min(times), result


def _sweep(model, qmodel, data, threads: int, executor=None):
    config = SensitivityConfig(mode="isolated", evidence=False, executor=executor)
    report = analyze_sensitivity(model, qmodel, data, config,
                                 runner_factory=OnnxrtRunnerFactory(OrtConfig(intra_op_num_threads=threads)))
    return dataclasses.replace(report, seconds=0.0)


def _start_ray() -> dict[str, float]:
    import ray

    os.environ.setdefault("RAY_worker_niceness", "0")
    start = time.perf_counter()
    ray.init(num_cpus=WORKERS, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    init = time.perf_counter() - start
    RayExecutor().map(_square, list(range(WORKERS)))  # starts the worker processes
    first = time.perf_counter() - start - init
    start = time.perf_counter()
    RayExecutor().map(_square, list(range(WORKERS)))
    return {"init": init, "first": first, "warm": time.perf_counter() - start}


def _square(_shared, x: int) -> int:
    return x * x


def measure(repeats: int, tiles: int) -> dict:
    embedded = load_embedded()
    model = str(embedded.model_path)
    calib = {k: np.concatenate([v, v]) for k, v in embedded.calib.items()}  # 512 samples
    qmodel = quantize(model, embedded.calib, CalibConfig(method="entropy"))
    big = {k: np.concatenate([v] * tiles) for k, v in embedded.eval_inputs.items()}
    sets = {"540 samples": embedded.eval_inputs, f"{540 * tiles} samples": big}
    rows: dict = {"layers": len(qmodel.layers), "sweeps": {}, "calibration": {}}
    serial = {}
    for label, data in sets.items():
        for threads in (1, 0):
            key = f"serial, ORT threads={'1' if threads else 'all'}"
            sweep = functools.partial(_sweep, model, qmodel, data, threads)
            seconds, serial[label, threads] = _best(repeats, sweep)
            rows["sweeps"].setdefault(label, {})[key] = seconds
    rows["ray_start"] = _start_ray()
    for label, data in sets.items():
        seconds, spread = _best(repeats, functools.partial(_sweep, model, qmodel, data, 1, RayExecutor()))
        assert spread == serial[label, 1], f"Ray sweep differs from the serial one on {label}"
        rows["sweeps"][label][f"Ray, {WORKERS} workers x 1 ORT thread"] = seconds
    for method in ("entropy", "minmax"):
        sharded = CalibConfig(method=method, executor=RayExecutor(), shards=WORKERS)
        one, a = _best(repeats, functools.partial(quantize, model, calib, CalibConfig(method=method)))
        two, b = _best(repeats, functools.partial(quantize, model, calib, sharded))
        assert a.model.SerializeToString() == b.model.SerializeToString(), method
        rows["calibration"][method] = {"serial": one, "ray": two}
    return rows


def markdown(rows: dict, command: str) -> str:
    start = rows["ray_start"]
    columns = list(next(iter(rows["sweeps"].values())))
    lines = ["## Ray", "",
             f"`{command}` on {platform.machine()}, {os.cpu_count()} cores shared with other work (load "
             f"average {os.getloadavg()[0]:.1f} at the end of the run), Python {platform.python_version()}. "
             f"Embedded digits CNN ({rows['layers']} quantized layers), a local Ray instance of {WORKERS} "
             "CPUs. Every Ray result was checked equal to the serial one (report values and ranking; Q/DQ "
             "model bytes). Best of the repeats, wall seconds.", "",
             f"Ray start-up: `ray.init` {start['init']:.1f} s, first tasks (worker processes start) "
             f"{start['first']:.1f} s, then a map of {WORKERS} trivial tasks {start['warm'] * 1000:.0f} ms.",
             "", "Isolated sweep (baseline + one evaluation per layer):", "",
             "| evaluation set | " + " | ".join(columns) + " | speed-up vs serial 1 thread |",
             "|---|" + "---:|" * (len(columns) + 1)]
    for label, cells in rows["sweeps"].items():
        values = [cells[c] for c in columns]
        cells_text = " | ".join(f"{v:.2f}" for v in values)
        lines.append(f"| {label} | {cells_text} | {values[0] / values[-1]:.2f}x |")
    lines += ["", "Calibration of 512 samples (quantize: placement, one statistics pass, ranges, Q/DQ):", "",
              f"| calibrator | serial | Ray, {WORKERS} shards |", "|---|---:|---:|"]
    lines += [f"| {m} | {c['serial']:.2f} | {c['ray']:.2f} |" for m, c in rows["calibration"].items()]
    return "\n".join(lines)


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=1, help="Runs per timing (the best is kept).")
    parser.add_argument("--tiles", type=int, default=20,
                        help="Copies of the 540 eval samples in the large set.")
    parser.add_argument("--no-write", action="store_true", help="Do not touch RESULTS.md.")
    args = parser.parse_args(argv)
    rows = measure(args.repeats, args.tiles)
    command = " ".join(["python", "benchmarks/ray.py", *(a for a in argv if a != "--no-write")])
    text = markdown(rows, command)
    print(text)
    if not args.no_write:
        _write_section("quantdbg:ray", text)


if __name__ == "__main__":
    main(sys.argv[1:])
