"""Ray on one machine: isolated sweep and calibration, serial vs 2 Ray workers, and what they ship.

On the embedded digits CNN (the zoo is not needed): Ray's start-up cost (``ray.init`` plus the
first task, which starts the worker processes), an isolated sensitivity sweep serially (ONNX
Runtime with one thread, and with its default of every core) and as Ray tasks on 2 workers of one
ORT thread each, on two evaluation sets (the 540 held-out samples, and that set tiled until one
evaluation takes over a second), and calibration of 512 samples serially vs 2 shards. Every Ray
result is checked against the serial one (same report ranking and values, same Q/DQ model bytes).
Each timing is the best of ``--repeats`` runs. Beside each Ray run: the bytes each task ships and
the object-store bytes each node holds for the run (``RayExecutor.shipments``).

``--no-shared-fs`` runs the same sweep, and sharded calibration of a generated model of
``--weights-mb`` MB of external weights, on a two-node cluster whose worker node cannot see the
driver's files (tests/on_ray/noshare.py: the worker node in a mount namespace of its own, the
driver's node without CPUs), so the models' data files travel through the object store. With
``--large-mb`` it also ships a generated model of that many MB of weights (over 2 GB: the case a
protobuf message cannot hold) to tasks that each read one of its weights from the node's copy, twice:
the bytes put, the copies written on the node and the time of each map.

    python benchmarks/ray.py                 # measure and write the "Ray" section of RESULTS.md
    python benchmarks/ray.py --no-write --repeats 1
    python benchmarks/ray.py --minilm 64      # MiniLM-L6 of the zoo instead: section "Ray: MiniLM-L6"
    python benchmarks/ray.py --no-shared-fs   # section "Ray without a shared filesystem"
    python benchmarks/ray.py --no-shared-fs --large-mb 2200   # and a model over 2 GB shipped
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import hashlib
import importlib.util
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
TESTS = HERE.parent / "tests"
# Python puts this script's folder first on sys.path, where this file would shadow the ray package
# (here and in Ray's workers, which inherit the driver's path): take it out before anything imports ray.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]
sys.path[:0] = [str(TESTS), str(TESTS / "on_ray")]  # models_large, and noshare (the two-node cluster)

import numpy as np  # noqa: E402
import onnx  # noqa: E402

from quantdbg.backends import OnnxrtRunnerFactory, OrtConfig  # noqa: E402
from quantdbg.config import CalibConfig  # noqa: E402
from quantdbg.demo import load_embedded  # noqa: E402
from quantdbg.execution import RayExecutor, node_cache  # noqa: E402
from quantdbg.model import SaveConfig, load_model, save_model  # noqa: E402
from quantdbg.model.external import base_of, location_of, tensor_array  # noqa: E402
from quantdbg.qdq import quantize  # noqa: E402
from quantdbg.sensitivity import SensitivityConfig, analyze_sensitivity  # noqa: E402

WORKERS = 2
STACK_WIDTH = 1024

AMDAHL = """How the cost grows with workers (Amdahl). A sweep of L layers is L + 1 independent
evaluations; with W workers and one evaluation taking t, it costs about T_driver + T_ship + ceil((L
+ 1) / W) * t. T_driver stays on the driver whatever W: loading and checking the models, the one
FP32 reference pass, building the switchable graph, rewriting the results file after each variant,
the evidence passes, ranking, and for the fallback search every round but the gallop (QuickXplain's
group tests depend on each other, one evaluation per round) plus the final verification. T_ship is
putting the evaluator (both models, the data and the FP32 outputs) into the object store once and
each worker deserializing it and opening its session once. The granularity term alone caps the
digits sweep (9 evaluations) at 9 / ceil(9 / 2) = 1.8x on 2 workers, and the driver's share lowers
it further; on this shared 2-core machine, whose load moves from one run to the next, a single
measurement can land on either side of that bound (serial and Ray runs alternate to even it out).
Calibration keeps on the driver the placement, the exact merge of the shard statistics (cheap: one
histogram add per tensor and shard) and the range search of every calibrator (entropy and MSE scan
the histograms: the larger part of a small model's calibration), so sharding pays only when the ONNX
Runtime passes dominate, i.e. for large calibration sets or models; on the digits CNN at N = 512 one
pass takes a fraction of a second and Ray's per-task overhead and the model's re-validation in every
shard cancel the gain."""


def _zoo_tasks():
    spec = importlib.util.spec_from_file_location("_zoo_tasks", HERE / "_zoo_tasks.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _write_section(key: str, text: str) -> None:
    _zoo_tasks().write_section(key, text)


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


def _burn(iterations: int) -> float:
    start = time.perf_counter()
    total = 0
    for i in range(iterations):
        total += i
    return time.perf_counter() - start


def _spare_cores(iterations: int = 4_000_000) -> float:
    """How many cores two busy processes get right now: 2 when the machine is idle, 1 when they share
    one core's worth with other work (this machine is shared, and its load moves)."""
    import multiprocessing

    alone = _burn(iterations)
    pool = multiprocessing.get_context("fork").Pool(2)
    try:
        start = time.perf_counter()
        pool.map(_burn, [iterations, iterations])
        together = time.perf_counter() - start
    finally:  # close, not terminate: a SIGTERM would reach the signal handler Ray's driver installed
        pool.close()
        pool.join()
    return 2 * alone / together


def measure(repeats: int, tiles: int) -> dict:
    embedded = load_embedded()
    model = str(embedded.model_path)
    calib = {k: np.concatenate([v, v]) for k, v in embedded.calib.items()}  # 512 samples
    qmodel = quantize(model, embedded.calib, CalibConfig(method="entropy"))
    big = {k: np.concatenate([v] * tiles) for k, v in embedded.eval_inputs.items()}
    sets = {"540 samples": embedded.eval_inputs, f"{540 * tiles} samples": big}
    rows: dict = {"layers": len(qmodel.layers), "spare_cores": [_spare_cores()], "load": [os.getloadavg()[0]],
                  "ray_start": _start_ray(), "sweeps": {}, "shipped": {}, "calibration": {}}
    ray_key = f"Ray, {WORKERS} workers x 1 ORT thread"
    # Serial and Ray runs alternate, so that both see the same load on this shared machine.
    for label, data in sets.items():
        executor = RayExecutor()
        runs = {"serial, ORT threads=1": functools.partial(_sweep, model, qmodel, data, 1),
                "serial, ORT threads=all": functools.partial(_sweep, model, qmodel, data, 0),
                ray_key: functools.partial(_sweep, model, qmodel, data, 1, executor)}
        found = _alternate(repeats, runs)
        serial, spread = found["serial, ORT threads=1"][1], found[ray_key][1]
        assert spread == serial, f"Ray sweep differs from the serial one on {label}"
        rows["sweeps"][label] = {key: seconds for key, (seconds, _) in found.items()}
        rows["shipped"][f"sweep, {label}"] = dataclasses.asdict(executor.shipments[-1])
    for method in ("entropy", "minmax"):
        executor = RayExecutor()
        sharded = CalibConfig(method=method, executor=executor, shards=WORKERS)
        runs = {"serial": functools.partial(quantize, model, calib, CalibConfig(method=method)),
                "ray": functools.partial(quantize, model, calib, sharded)}
        found = _alternate(repeats, runs)
        same = found["serial"][1].model.SerializeToString() == found["ray"][1].model.SerializeToString()
        assert same, method
        rows["calibration"][method] = {key: seconds for key, (seconds, _) in found.items()}
        rows["shipped"][f"calibration, {method}"] = dataclasses.asdict(executor.shipments[-1])
    rows["spare_cores"].append(_spare_cores())
    rows["load"].append(os.getloadavg()[0])
    return rows


def measure_minilm(repeats: int, samples: int) -> dict:
    """The isolated sweep of MiniLM-L6 (zoo; 48 layers, so 49 evaluations) on its first ``samples``
    evaluation rows, serially and on Ray, both with one ONNX Runtime thread per evaluation."""
    task = _zoo_tasks().load_task("minilm_l6_v2_text", Path(tempfile.mkdtemp(prefix="quantdbg-ray-")))
    model = str(task.model)
    qmodel = quantize(model, task.calib, CalibConfig(method="minmax"))
    data = {k: v[:samples] for k, v in task.eval.items()}
    rows: dict = {"layers": len(qmodel.layers), "spare_cores": [_spare_cores()], "ray_start": _start_ray()}
    found = _alternate(repeats, {"serial": functools.partial(_sweep, model, qmodel, data, 1),
                                 "ray": functools.partial(_sweep, model, qmodel, data, 1, RayExecutor())})
    assert found["serial"][1] == found["ray"][1], "Ray sweep differs from the serial one"
    rows["sweep"] = {key: seconds for key, (seconds, _) in found.items()}
    rows["samples"] = samples
    rows["spare_cores"].append(_spare_cores())
    return rows


def minilm_markdown(rows: dict, command: str) -> str:
    sweep, evaluations = rows["sweep"], rows["layers"] + 1
    bound = evaluations / -(-evaluations // WORKERS)
    return "\n".join([
        "## Ray: MiniLM-L6", "",
        f"`{command}` (zoo model, minmax INT8, isolated sweep of its {rows['layers']} layers on the first "
        f"{rows['samples']} evaluation rows: {evaluations} evaluations; one ONNX Runtime thread per "
        f"evaluation on both sides; the Ray report was checked equal to the serial one). Load average "
        f"{os.getloadavg()[0]:.1f} at the end; cores two busy processes got, before and after: "
        + ", ".join(f"{c:.2f}" for c in rows["spare_cores"]) + " of 2. Best of the repeats.", "",
        f"| serial | Ray, {WORKERS} workers | speed-up | seconds per evaluation (serial) | bound "
        "(granularity) |", "|---:|---:|---:|---:|---:|",
        f"| {sweep['serial']:.1f} s | {sweep['ray']:.1f} s | {sweep['serial'] / sweep['ray']:.2f}x | "
        f"{sweep['serial'] / evaluations:.2f} | {bound:.2f}x |"])


def _cache_bytes(_shared, _item) -> int:
    """On a worker: the bytes of its node's cache of the driver's files (the copies on its disk)."""
    root = node_cache.cache_root()
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def _noshare_files(scratch: Path, weights_mb: int, large_mb: int) -> dict:
    """The digits CNN and a generated MatMul stack (and a larger one with ``large_mb``), each with its
    weights in a data file, in ``scratch``."""
    import models_large

    embedded = load_embedded()
    digits = scratch / "digits"
    digits.mkdir()
    save_model(onnx.load(str(embedded.model_path)), digits / "model.onnx", SaveConfig(external_data=True))
    stack = scratch / "stack"
    stack.mkdir()
    models_large.matmul_stack(stack, weights_mb * 2**20, STACK_WIDTH)
    files = {"digits": digits / "model.onnx", "embedded": embedded, "stack": stack / "model.onnx",
             "stack_calib": {"x": models_large.inputs(STACK_WIDTH, 64)}}
    if large_mb:
        (scratch / "large").mkdir()
        files["large"] = models_large.matmul_stack(scratch / "large", large_mb * 10**6, STACK_WIDTH)
    return files


def _timed(run) -> tuple[float, object]:
    start = time.perf_counter()
    result = run()
    return time.perf_counter() - start, result


def measure_noshare(repeats: int, tiles: int, weights_mb: int, large_mb: int) -> dict:
    """The sweep and a large model's sharded calibration on the two-node cluster whose worker node
    cannot see the driver's files."""
    import noshare

    refusal = noshare.unshare_refusal()
    if refusal is not None:
        raise SystemExit(f"--no-shared-fs needs a worker node with mounts of its own: {refusal}")
    scratch = Path(tempfile.mkdtemp(prefix="quantdbg-ray-bench-"))  # in the temp folder: hidden from it
    try:
        files = _noshare_files(scratch, weights_mb, large_mb)
        rows: dict = {"spare_cores": [_spare_cores()], "load": [os.getloadavg()[0]], "sweeps": {},
                      "shipped": {}, "weights": (files["stack"].parent / "model.onnx.data").stat().st_size}
        start = time.perf_counter()
        with noshare.cluster(noshare.hidden_folders(scratch), cpus=WORKERS):
            rows["cluster_start"] = time.perf_counter() - start
            _noshare_sweeps(rows, files, repeats, tiles)
            _noshare_calibration(rows, files, repeats)
            if large_mb:
                _noshare_large(rows, files["large"])
            rows["node_cache"] = RayExecutor().map(_cache_bytes, [0])[0]
        rows["spare_cores"].append(_spare_cores())
        rows["load"].append(os.getloadavg()[0])
        return rows
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _noshare_sweeps(rows: dict, files: dict, repeats: int, tiles: int) -> None:
    embedded, model = files["embedded"], str(files["digits"])
    qmodel = quantize(model, embedded.calib, CalibConfig(method="entropy"))
    rows["layers"] = len(qmodel.layers)
    big = {k: np.concatenate([v] * tiles) for k, v in embedded.eval_inputs.items()}
    for label, data in {"540 samples": embedded.eval_inputs, f"{540 * tiles} samples": big}.items():
        executor = RayExecutor()
        found = _alternate(repeats, {"serial": functools.partial(_sweep, model, qmodel, data, 1),
                                     "ray": functools.partial(_sweep, model, qmodel, data, 1, executor)})
        assert found["serial"][1] == found["ray"][1], f"Ray sweep differs from the serial one on {label}"
        rows["sweeps"][label] = {key: seconds for key, (seconds, _) in found.items()}
        rows["shipped"][f"digits sweep, {label}"] = dataclasses.asdict(executor.shipments[-1])


def _noshare_calibration(rows: dict, files: dict, repeats: int) -> None:
    """Sharded minmax calibration of the MatMul stack: the first map ships its data file, later ones
    find it on the node."""
    model, calib = str(files["stack"]), files["stack_calib"]
    executor = RayExecutor()
    sharded = CalibConfig(method="minmax", executor=executor, shards=WORKERS)
    first, spread = _timed(functools.partial(quantize, model, calib, sharded, batch_size=16))
    rows["shipped"]["stack calibration, first map"] = dataclasses.asdict(executor.shipments[-1])
    serial = CalibConfig(method="minmax")
    found = _alternate(repeats, {"serial": functools.partial(quantize, model, calib, serial, batch_size=16),
                                 "ray": functools.partial(quantize, model, calib, sharded, batch_size=16)})
    same = found["serial"][1].model.SerializeToString() == spread.model.SerializeToString()
    assert same, "sharded calibration differs from the serial one"
    rows["shipped"]["stack calibration, later map"] = dataclasses.asdict(executor.shipments[-1])
    rows["calibration"] = {"serial": found["serial"][0], "first": first, "ray": found["ray"][0]}


LARGE_TASKS = 8


def _weight_read(model: onnx.ModelProto, name: str) -> tuple[str, str, int, int]:
    """On a worker: the digest of weight ``name`` of the shipped model, read from the node's copy of
    its data file, with the node, the worker process and the copy's inode."""
    import ray

    tensor = next(t for t in model.graph.initializer if t.name == name)
    copy = Path(base_of(tensor)) / location_of(tensor)
    values = hashlib.sha256(tensor_array(tensor).tobytes()).hexdigest()
    return values, ray.get_runtime_context().get_node_id(), os.getpid(), copy.stat().st_ino


def _noshare_large(rows: dict, path: Path) -> None:
    """Two maps of :data:`LARGE_TASKS` tasks over the large model, each task reading one of its weights
    on the worker node: the weights must equal the driver's, and the data file travel and land once."""
    model = load_model(path)  # lazy: the weights stay in the data file
    names = [t.name for t in model.graph.initializer][:: max(1, len(model.graph.initializer) // LARGE_TASKS)]
    names = names[:LARGE_TASKS]
    expected = [hashlib.sha256(tensor_array(t).tobytes()).hexdigest()
                for name in names for t in model.graph.initializer if t.name == name]
    executor, maps = RayExecutor(), []
    for _ in range(2):
        seconds, found = _timed(functools.partial(executor.map, _weight_read, names, shared=model))
        assert [values for values, *_ in found] == expected, "a weight read on the node differs"
        maps.append({"seconds": seconds, "nodes": len({f[1] for f in found}),
                     "workers": len({f[2] for f in found}), "copies": len({(f[1], f[3]) for f in found}),
                     **dataclasses.asdict(executor.shipments[-1])})
    rows["large"] = {"weights": path.with_name(path.name + ".data").stat().st_size,
                     "graph": path.stat().st_size, "maps": maps}


def large_markdown(large: dict) -> list[str]:
    """The rows of the large model's shipping (see :func:`_noshare_large`)."""
    over = ", over 2 GiB: no protobuf message holds it with its weights" if large["weights"] > 2**31 else ""
    lines = ["", f"A model of {_bytes(large['weights'])} of weights (the MatMul stack, its graph alone "
             f"{_bytes(large['graph'])}{over}), passed as the shared object of {LARGE_TASKS} tasks that "
             "each read one of its weights on the worker node and return its digest (all equal to the "
             "driver's), twice with the same executor:", "",
             "| map | tasks | worker processes | nodes | copies of the data file on the nodes | per task | "
             "shared object | data file (once per node) | of it put by this map | wall seconds |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for label, m in zip(("first", "second"), large["maps"], strict=True):
        lines.append(f"| {label} | {m['tasks']} | {m['workers']} | {m['nodes']} | {m['copies']} | "
                     f"{_bytes(m['per_task'])} | {_bytes(m['shared'])} | {_bytes(m['files'])} | "
                     f"{_bytes(m['new_files'])} | {m['seconds']:.1f} |")
    return lines


def noshare_markdown(rows: dict, command: str) -> str:
    calibration, mb = rows["calibration"], rows["weights"] / 2**20
    lines = ["## Ray without a shared filesystem", "",
             f"`{command}`: a two-node cluster on this machine (tests/on_ray/noshare.py): the driver's node "
             f"offers no CPU; the worker node ({WORKERS} CPUs) runs in a mount namespace of its own, with an "
             "empty tmpfs over the temporary folder (where the models, data and scripts are) and the tests "
             "folder, so every file a task reads travels through Ray's object store. The models keep their "
             "weights in a data file. Ray results were checked equal to the serial ones. Best of the "
             f"repeats, wall seconds; the cluster took {rows['cluster_start']:.0f} s to start.", "",
             _conditions(rows), "", "| run | serial, 1 ORT thread | Ray, 2 workers | speed-up |",
             "|---|---:|---:|---:|"]
    for label, cells in rows["sweeps"].items():
        lines.append(f"| digits isolated sweep ({rows['layers'] + 1} evaluations), {label} | "
                     f"{cells['serial']:.2f} | {cells['ray']:.2f} | {cells['serial'] / cells['ray']:.2f}x |")
    lines += [f"| MatMul stack of {mb:.0f} MiB, minmax calibration ({WORKERS} shards), first map | "
              f"{calibration['serial']:.2f} | {calibration['first']:.2f} | "
              f"{calibration['serial'] / calibration['first']:.2f}x |",
              f"| the same, a later map (the data file already on the node) | {calibration['serial']:.2f} | "
              f"{calibration['ray']:.2f} | {calibration['serial'] / calibration['ray']:.2f}x |", "",
              "What they sent through the object store (each run's last map; a file is put once per executor "
              "and written once per node, into its temporary folder):", ""]
    lines += shipped_table(rows["shipped"])
    lines += ["", f"The worker node's cache of the driver's files held {_bytes(rows['node_cache'])} on disk "
              "at the end: each data file once, whatever the number of tasks and maps."]
    if "large" in rows:
        lines += large_markdown(rows["large"])
    return "\n".join(lines)


def _alternate(repeats: int, runs: dict) -> dict:
    """name -> (best wall seconds, last result), the runs taking turns ``repeats`` times."""
    times: dict = {name: [] for name in runs}
    results: dict = {}
    for _ in range(repeats):
        for name, run in runs.items():
            start = time.perf_counter()
            results[name] = run()
            times[name].append(time.perf_counter() - start)
    return {name: (min(times[name]), results[name]) for name in runs}


def _conditions(rows: dict) -> str:
    """The machine during the run: load average and the cores two busy processes got."""
    return ("Load average (1 min) at the start and the end: " + ", ".join(f"{x:.1f}" for x in rows["load"])
            + "; cores two busy processes got (a pure-Python loop alone vs two at once), before and after: "
            + ", ".join(f"{c:.2f}" for c in rows["spare_cores"]) + f" of {WORKERS}.")


def _bytes(n: int) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def shipped_table(shipped: dict) -> list[str]:
    """What each Ray run put in the object store (its last map), one row per run."""
    lines = ["| Ray run | tasks | per task | shared object (once per node) | driver files (once per node) | "
             "object store per node |", "|---|---:|---:|---:|---:|---:|"]
    for label, s in shipped.items():
        files = _bytes(s["files"]) + (f" ({_bytes(s['new_files'])} put by this map)" if s["files"] else "")
        lines.append(f"| {label} | {s['tasks']} | {_bytes(s['per_task'])} | {_bytes(s['shared'])} | "
                     f"{files} | {_bytes(s['shared'] + s['files'])} |")
    return lines


def markdown(rows: dict, command: str) -> str:
    start = rows["ray_start"]
    columns = list(next(iter(rows["sweeps"].values())))
    lines = ["## Ray", "",
             f"`{command}` on {platform.machine()}, {os.cpu_count()} cores shared with other work, Python "
             f"{platform.python_version()}. Embedded digits CNN ({rows['layers']} quantized layers), a local "
             f"Ray instance of {WORKERS} CPUs. Every Ray result was checked equal to the serial one (report "
             "values and ranking; Q/DQ model bytes). Best of the repeats, wall seconds.", "",
             _conditions(rows), "", f"Ray start-up: `ray.init` {start['init']:.1f} s, first tasks (worker "
             f"processes start) {start['first']:.1f} s, then a map of {WORKERS} trivial tasks "
             f"{start['warm'] * 1000:.0f} ms.",
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
    lines += ["", "What the Ray runs sent through the object store (every worker runs on the driver's node "
              "here, so the model file is read in place and no file travels):", ""]
    lines += shipped_table(rows["shipped"])
    return "\n".join(lines + ["", AMDAHL])


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2, help="Runs per timing (the best is kept).")
    parser.add_argument("--tiles", type=int, default=10,
                        help="Copies of the 540 eval samples in the large set.")
    parser.add_argument("--minilm", type=int, metavar="SAMPLES",
                        help="Measure the isolated sweep of the zoo's MiniLM-L6 on this many rows instead.")
    parser.add_argument("--no-shared-fs", action="store_true",
                        help="On a two-node cluster whose worker node cannot see the driver's files instead.")
    parser.add_argument("--weights-mb", type=int, default=256,
                        help="With --no-shared-fs: weights of the generated model calibrated on it.")
    parser.add_argument("--large-mb", type=int, default=0,
                        help="With --no-shared-fs: also ship a generated model of this many MB of weights.")
    parser.add_argument("--no-write", action="store_true", help="Do not touch RESULTS.md.")
    args = parser.parse_args(argv)
    command = " ".join(["python", "benchmarks/ray.py", *(a for a in argv if a != "--no-write")])
    if args.no_shared_fs:
        key = "quantdbg:ray-noshare"
        rows = measure_noshare(args.repeats, args.tiles, args.weights_mb, args.large_mb)
        text = noshare_markdown(rows, command)
    elif args.minilm:
        key, text = "quantdbg:ray-minilm", minilm_markdown(measure_minilm(args.repeats, args.minilm), command)
    else:
        key, text = "quantdbg:ray", markdown(measure(args.repeats, args.tiles), command)
    print(text)
    if not args.no_write:
        _write_section(key, text)


if __name__ == "__main__":
    main(sys.argv[1:])
