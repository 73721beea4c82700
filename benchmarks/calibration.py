"""Calibration cost, side by side in one run: quantdbg vs ONNX Runtime vs ModelOpt vs the floor.

For each model and each number of calibration samples N, every configuration runs in its own
child process, one at a time:

- ``floor``: one FP32 ONNX Runtime pass over the same N samples (session creation + run), with
  the ONNX Runtime of the peers venv (``floor@peers``) and of quantdbg's venv (``floor@qdbg``);
  each tool's ratio is taken against the floor measured with its own ONNX Runtime build.
- ``ort-minmax``, ``ort-entropy``, ``ort-percentile``: ``onnxruntime.quantization.quantize_static``
  (QDQ, per-channel INT8 weights, symmetric INT8 activations, op types Conv/ConvTranspose/Gemm/
  MatMul -- the ones quantdbg quantizes -- percentile 99.99, bin counts left at ONNX Runtime's
  defaults: 128 for Entropy, 2048 for Percentile).
- ``modelopt-max``, ``modelopt-entropy``: ``modelopt.onnx.quantization.quantize(quantize_mode=
  "int8")`` on the CPU provider with its default placement, ``high_precision_dtype="fp32"`` so it
  writes an FP32 Q/DQ model like the others (its default would also convert the model to FP16).
- ``quantdbg-minmax``, ``-entropy``, ``-percentile``, ``-mse``: ``quantdbg.api.quantize`` with
  ``CalibConfig(method=...)`` (2048 bins), data from ``quantdbg.data.load_npz``.

Every configuration reads the same batches (``--batch-size``, default 16), gets one core (ONNX
Runtime sessions pinned to one intra-op and one inter-op thread, OMP/BLAS/numba to one thread),
loads its data before the clock starts, and ends by writing its quantized model. Timed: from
the model path and the in-memory samples to the written model (imports and data loading are
reported apart). Peak RSS is the child's ``ru_maxrss`` (the samples themselves included); the
child's address space is capped (``--mem-gib``, default 14) and running out of it is reported
as OOM. The zoo's calibration sets that hold fewer than N samples (digits 256, MiniLM 180)
are repeated cyclically up to N.

  python benchmarks/calibration.py                      # all three models, N = 32 128 512
  python benchmarks/calibration.py --quick              # digits CNN, N=32: a smoke run
  python benchmarks/calibration.py --models minilm_l6_v2_text --n 512 --configs floor quantdbg-mse

Writes ``--json`` (default benchmarks/calibration_results.json) and the "Calibration cost"
section of ``--md`` (default benchmarks/RESULTS.md); ``--quick`` writes neither unless asked.
Peers run in ``$QDBG_PEERS_PYTHON`` (default /work/peers_venv/bin/python, made by
benchmarks/setup_peers.sh); quantdbg in ``$QDBG_PYTHON`` (default: this interpreter).
"""
from __future__ import annotations

import argparse
import json
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _bench  # noqa: E402

ORT_METHODS = {"ort-minmax": "MinMax", "ort-entropy": "Entropy", "ort-percentile": "Percentile"}
MODELOPT_METHODS = {"modelopt-max": "max", "modelopt-entropy": "entropy"}
QDBG_METHODS = {f"quantdbg-{m}": m for m in ("minmax", "entropy", "percentile", "mse")}
CONFIGS = ("floor@peers", "floor@qdbg", *ORT_METHODS, *MODELOPT_METHODS, *QDBG_METHODS)
DEFAULT_MODELS = ("digits_cnn", "resnet50_shape", "minilm_l6_v2_text")
OP_TYPES = ["Conv", "ConvTranspose", "Gemm", "MatMul"]
PERCENTILE = 99.99


# --------------------------------------------------------------------------------------------
# child side: one configuration, measured from inside


def _elapsed(t0: float, c0: float) -> dict:
    """Wall and CPU seconds since (t0, c0). With every pool at one thread, CPU time is the part
    of the measurement that other work on the machine does not inflate."""
    return {"work_s": time.perf_counter() - t0, "work_cpu_s": time.process_time() - c0, "t_work0": t0}


def _batches(arrays: dict, batch_size: int) -> list[dict]:
    n = len(next(iter(arrays.values())))
    return [{k: v[i:i + batch_size] for k, v in arrays.items()} for i in range(0, n, batch_size)]


def _load(data: str) -> dict:
    import numpy as np

    with np.load(data, allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


def _floor(model: str, data: str, batch_size: int, out: Path) -> dict:
    import onnxruntime as ort

    batches = _batches(_load(data), batch_size)
    t0, c0 = time.perf_counter(), time.process_time()
    sess = ort.InferenceSession(model, ort.SessionOptions(), providers=["CPUExecutionProvider"])
    for feed in batches:
        sess.run(None, feed)
    return _elapsed(t0, c0)


def _ort(method: str, model: str, data: str, batch_size: int, out: Path) -> dict:
    from onnxruntime.quantization import (
        CalibrationDataReader,
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    class Reader(CalibrationDataReader):
        def __init__(self, batches):
            self.batches, self.it = batches, iter(batches)

        def get_next(self):
            return next(self.it, None)

        def rewind(self):
            self.it = iter(self.batches)

    reader = Reader(_batches(_load(data), batch_size))
    t0, c0 = time.perf_counter(), time.process_time()
    quantize_static(model, str(out), reader, quant_format=QuantFormat.QDQ, op_types_to_quantize=OP_TYPES,
                    per_channel=True, activation_type=QuantType.QInt8, weight_type=QuantType.QInt8,
                    calibrate_method=getattr(CalibrationMethod, method),
                    extra_options={"ActivationSymmetric": True, "WeightSymmetric": True,
                                   "CalibPercentile": PERCENTILE})
    return _elapsed(t0, c0)


def _modelopt(method: str, model: str, data: str, batch_size: int, out: Path) -> dict:
    import logging

    from modelopt.onnx.quantization import quantize

    arrays = _load(data)
    shapes = ",".join(f"{k}:" + "x".join(map(str, (batch_size, *v.shape[1:]))) for k, v in arrays.items())
    t0, c0 = time.perf_counter(), time.process_time()
    quantize(model, quantize_mode="int8", calibration_data=arrays, calibration_method=method,
             calibration_shapes=shapes, calibration_eps=["cpu"], high_precision_dtype="fp32",
             output_path=str(out), log_level="WARNING")
    logging.shutdown()
    return _elapsed(t0, c0)


def _quantdbg(method: str, model: str, data: str, batch_size: int, out: Path) -> dict:
    from quantdbg.config import CalibConfig
    from quantdbg.data import load_npz
    from quantdbg.qdq import quantize

    feeds = load_npz(data, batch_size=batch_size)
    t0, c0 = time.perf_counter(), time.process_time()
    qmodel = quantize(model, feeds, calib=CalibConfig(method=method))
    qmodel.save(out)
    return {**_elapsed(t0, c0), "n_records": len(qmodel.records)}


def child(config: str, model: str, data: str, batch_size: int, result: str) -> None:
    """Runs one configuration and writes its own measurements to ``result`` as JSON."""
    t_start = time.perf_counter()
    _bench.pin_ort_threads()
    tmp = Path(tempfile.mkdtemp(prefix="qdbg_cal_"))
    try:
        # The tools get a copy in a scratch folder: ModelOpt writes intermediate files next to the
        # model and saves its preprocessed graph over the path it was given (through a symlink
        # too), so it must never see the zoo's own file.
        shutil.copyfile(model, tmp / "model.onnx")
        src, out = str(tmp / "model.onnx"), tmp / "quantized.onnx"
        if config.startswith("floor"):
            rec = _floor(src, data, batch_size, out)
        elif config in ORT_METHODS:
            rec = _ort(ORT_METHODS[config], src, data, batch_size, out)
        elif config in MODELOPT_METHODS:
            rec = _modelopt(MODELOPT_METHODS[config], src, data, batch_size, out)
        else:
            rec = _quantdbg(QDBG_METHODS[config], src, data, batch_size, out)
        rec["out_mib"] = round(out.stat().st_size / 2**20, 2) if out.exists() else 0.0
        if out.exists():  # after the clock: what the tool produced, to check it did quantize
            import onnx

            ops = [n.op_type for n in onnx.load(str(out), load_external_data=False).graph.node]
            rec["n_quantize"] = ops.count("QuantizeLinear")
            rec["n_dequantize"] = ops.count("DequantizeLinear")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    rec["setup_s"] = rec.pop("t_work0") - t_start  # imports + data loading, before the clock
    rec["ok"] = True
    Path(result).write_text(json.dumps(rec))


def versions(result: str) -> None:
    """Writes the versions of what this interpreter would run."""
    from importlib import metadata

    rec = {"python": sys.version.split()[0]}
    for dist in ("onnxruntime", "onnx", "numpy", "nvidia-modelopt", "torch", "quantdbg", "numba"):
        try:
            rec[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            pass
    rec["ok"] = True
    Path(result).write_text(json.dumps(rec))


# --------------------------------------------------------------------------------------------
# parent side: schedule, measure, report


def python_for(config: str) -> Path:
    ours = config.startswith("quantdbg") or config == "floor@qdbg"
    return _bench.QDBG_PYTHON if ours else _bench.PEERS_PYTHON


def floor_for(config: str) -> str:
    return "floor@qdbg" if python_for(config) == _bench.QDBG_PYTHON else "floor@peers"


def measure(args: argparse.Namespace) -> dict:
    """Runs every (model, N, config) child and returns the raw records."""
    runs: list[dict] = []
    work = Path(tempfile.mkdtemp(prefix="qdbg_calbench_"))
    logs = Path(args.logs)
    try:
        for name in args.models:
            model = _bench.MODELS[name]
            for n in args.n:
                data, distinct = _bench.calib_subset(model, n, work / f"{name}_n{n}.npz")
                for config in args.configs:
                    cmd = [str(Path(__file__).resolve()), "--child", config, "--model-path", str(model.onnx),
                           "--data-path", str(data), "--batch-size", str(args.batch_size)]
                    run = _bench.run_child(python_for(config), cmd, logs / f"{name}_n{n}_{config}.log",
                                           args.mem_gib, args.timeout)
                    rec = {"model": name, "n": n, "distinct": distinct, "config": config, **run.to_dict()}
                    runs.append(rec)
                    _progress(rec)
                data.unlink()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return {"runs": runs, "versions": {"peers": _versions(_bench.PEERS_PYTHON, logs),
                                       "qdbg": _versions(_bench.QDBG_PYTHON, logs)}}


def _versions(python: Path, logs: Path) -> dict:
    run = _bench.run_child(python, [str(Path(__file__).resolve()), "--versions"], logs / "versions.log",
                           None, 120)
    return run.result


def _progress(rec: dict) -> None:
    work = rec["result"].get("work_s")
    what = f"{work:8.2f} s" if work is not None else f"{rec['status']:>10}"
    print(f"{rec['model']:>18} N={rec['n']:<4} {rec['config']:<20} {what}  "
          f"peak {rec['peak_rss_mib']:8.0f} MiB  load {rec['load_before']:.1f}->{rec['load_after']:.1f}  "
          f"{rec['error'][:80]}", flush=True)


# --------------------------------------------------------------------------------------------
# report


def _cell(rec: dict | None, floor: dict | None) -> str:
    if rec is None:
        return "--"
    if rec["status"] != "ok":
        return f"**{rec['status'].upper()}** ({rec['peak_rss_mib']:.0f} MiB)"
    res = rec["result"]
    if floor is None or floor["status"] != "ok":
        return f"{res['work_s']:.1f} s ({rec['peak_rss_mib']:.0f} MiB)"
    wall = res["work_s"] / floor["result"]["work_s"]
    cpu = res["work_cpu_s"] / floor["result"]["work_cpu_s"]
    return f"{wall:.2f}x / {cpu:.2f}x ({rec['peak_rss_mib']:.0f} MiB)"


def _header(results: dict) -> list[str]:
    m, peers, ours = results["machine"], results["versions"]["peers"], results["versions"]["qdbg"]
    cmds = results["commands"]
    return [
        f"Command{'s' if len(cmds) > 1 else ''} (repo root; a later command's runs replace the earlier "
        "ones for the same model, N and configuration):", "", "```",
        *[f"# {c['date']}, commit {c['commit']}\n{c['command']}" for c in cmds], "```", "",
        f"Machine: {m['cpu']}, {m['cores']} cores, {m['mem_gib']} GiB, {m['os']} "
        f"(1-min load average {m['loadavg'][0]:.1f} at the start, {results['load_end']:.1f} at the end; "
        "per run in the JSON).",
        f"Peers venv: Python {peers.get('python')}, onnxruntime {peers.get('onnxruntime')} (CPU), "
        f"nvidia-modelopt {peers.get('nvidia-modelopt')}, onnx {peers.get('onnx')}, "
        f"numpy {peers.get('numpy')}, torch {peers.get('torch')}.",
        f"quantdbg venv: quantdbg {ours.get('quantdbg')}, onnxruntime {ours.get('onnxruntime')}, "
        f"onnx {ours.get('onnx')}, numpy {ours.get('numpy')}, numba {ours.get('numba', '-')}.",
        f"Setting: batch size {results['batch_size']}, ONNX Runtime pinned to 1 intra-op thread "
        "in every run, "
        f"address space capped at {results['mem_gib']} GiB per run, time limit {results['timeout']:.0f} s.",
        "", "Cell = wall time / CPU time of the work as multiples of the FP32 floor's, the floor measured "
        "with the same ONNX Runtime build as the tool (floor rows: seconds); peak RSS of the whole child in "
        "parentheses, the samples included. The peers and the floor run on one thread, so for them CPU "
        "time is the figure that load from other work does not inflate. quantdbg streams each batch's "
        "statistics on one worker thread while ONNX Runtime runs the next batch, so on 2 cores its wall "
        "time hides part of its CPU time: wall time is what a user waits, CPU time what the work costs.",
        ""]


def markdown(results: dict) -> str:
    """The "Calibration cost" section: setting, ratio-to-floor tables, failures."""
    runs = results["runs"]
    index = {(r["model"], r["n"], r["config"]): r for r in runs}
    models = list(dict.fromkeys(r["model"] for r in runs))
    ns = sorted({r["n"] for r in runs})
    configs = list(dict.fromkeys(r["config"] for r in runs))
    out = _header(results)
    for name in models:
        out += [f"### {name}", "", "| configuration | " + " | ".join(f"N={n}" for n in ns) + " |",
                "|---|" + "---|" * len(ns)]
        for config in configs:
            cells = []
            for n in ns:
                rec, floor = index.get((name, n, config)), index.get((name, n, floor_for(config)))
                if config.startswith("floor") and rec and rec["status"] == "ok":
                    res, rss = rec["result"], rec["peak_rss_mib"]
                    cells.append(f"{res['work_s']:.2f} s / {res['work_cpu_s']:.2f} s ({rss:.0f} MiB)")
                else:
                    cells.append(_cell(rec, floor))
            out.append(f"| {config} | " + " | ".join(cells) + " |")
        out.append("")
    out += _targets(index, models, ns)
    failed = [r for r in runs if r["status"] != "ok"]
    out += ["Failures:" if failed else "Failures: none.", ""]
    out += [f"- {r['model']} N={r['n']} {r['config']}: {r['status']} after {r['wall_s']:.0f} s, peak "
            f"{r['peak_rss_mib']:.0f} MiB -- `{r['error']}`" for r in failed]
    return "\n".join(out) + "\n"


def _ratio(index: dict, key: tuple, field: str = "work_s") -> float | None:
    rec, floor = index.get(key), index.get((*key[:2], floor_for(key[2])))
    if rec is None or floor is None or rec["status"] != "ok" or floor["status"] != "ok":
        return None
    return rec["result"][field] / floor["result"][field]


def _verdict(wall: float, cpu: float, ok) -> str:
    words = ["met" if ok(r) else "NOT met" for r in (wall, cpu)]
    return f"{wall:.2f}x wall / {cpu:.2f}x CPU: {words[0]} / {words[1]}"


def _targets(index: dict, models: list[str], ns: list[int]) -> list[str]:
    """The issue's targets at the largest N: quantdbg minmax <= 1.3x, histogram methods <= 1.6x
    the floor, >= 2x faster than ModelOpt entropy, peak RSS flat from the smallest to the largest N."""
    lo, hi = ns[0], ns[-1]
    out = [f"Targets at N={hi}, judged on wall time and on CPU time (ratio to floor; speed-up = ModelOpt "
           f"entropy time / quantdbg entropy time; RSS growth = each quantdbg method's peak-RSS growth from "
           f"N={lo} to N={hi}, minus the floor's own growth, which is the samples themselves):", ""]
    for name in models:
        parts = []
        for method, limit in (("minmax", 1.3), ("entropy", 1.6), ("percentile", 1.6), ("mse", 1.6)):
            key = (name, hi, f"quantdbg-{method}")
            wall, cpu = _ratio(index, key), _ratio(index, key, "work_cpu_s")
            if wall is not None and cpu is not None:
                parts.append(f"{method} <= {limit}x: " + _verdict(wall, cpu, lambda r, lim=limit: r <= lim))
        mo, qe = index.get((name, hi, "modelopt-entropy")), index.get((name, hi, "quantdbg-entropy"))
        if mo and qe and mo["status"] == qe["status"] == "ok":
            wall, cpu = (mo["result"][f] / qe["result"][f] for f in ("work_s", "work_cpu_s"))
            parts.append("speed-up vs ModelOpt entropy >= 2x: " + _verdict(wall, cpu, lambda r: r >= 2))
        growth = _rss_growth(index, name, lo, hi)
        if growth is not None:
            parts.append(f"RSS growth {growth}")
        out.append(f"- {name}: " + "; ".join(parts) if parts else f"- {name}: not measured")
    return [*out, ""]


def _rss_growth(index: dict, name: str, lo: int, hi: int) -> str | None:
    """Peak-RSS growth of each quantdbg method from ``lo`` to ``hi`` samples, net of the floor's own
    growth (the samples themselves)."""
    floor_lo, floor_hi = index.get((name, lo, "floor@qdbg")), index.get((name, hi, "floor@qdbg"))
    if lo == hi or not floor_lo or not floor_hi:
        return None
    data = floor_hi["peak_rss_mib"] - floor_lo["peak_rss_mib"]
    rss = {key: r["peak_rss_mib"] for key, r in index.items()}
    growth = {QDBG_METHODS[c]: rss[(name, hi, c)] - rss[(name, lo, c)] - data
              for c in QDBG_METHODS if (name, lo, c) in rss and (name, hi, c) in rss}
    return ", ".join(f"{m} {g:+.0f} MiB" for m, g in growth.items()) or None


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description="Calibration cost of quantdbg vs ONNX Runtime vs ModelOpt.")
    ap.add_argument("--models", nargs="+", choices=sorted(_bench.MODELS))
    ap.add_argument("--n", nargs="+", type=int, help="calibration sample counts (default 32 128 512)")
    ap.add_argument("--configs", nargs="+", choices=CONFIGS, default=list(CONFIGS))
    ap.add_argument("--quick", action="store_true", help="digits CNN at N=32 only, no files written")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--mem-gib", type=float, default=14.0, help="address-space cap per child")
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds per child")
    ap.add_argument("--json", help="raw results (default benchmarks/calibration_results.json)")
    ap.add_argument("--md", help="RESULTS.md to update (default benchmarks/RESULTS.md)")
    ap.add_argument("--merge", help="a previous --json: keep its runs except those measured now")
    ap.add_argument("--render", help="only re-render --md from this --json (no measurement)")
    ap.add_argument("--logs", default=str(Path(tempfile.gettempdir()) / "qdbg_calbench_logs"))
    ap.add_argument("--child", choices=CONFIGS, help=argparse.SUPPRESS)
    ap.add_argument("--versions", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--model-path", help=argparse.SUPPRESS)
    ap.add_argument("--data-path", help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    a.models = a.models or (["digits_cnn"] if a.quick else list(DEFAULT_MODELS))
    a.n = a.n or ([32] if a.quick else [32, 128, 512])
    if not a.quick:
        a.json = a.json or str(_bench.HERE / "calibration_results.json")
        a.md = a.md or str(_bench.HERE / "RESULTS.md")
    return a


def _merged(a: argparse.Namespace, results: dict) -> dict:
    """``results`` on top of the runs of ``--merge``: a re-measured (model, N, config) replaces the old."""
    prev = json.loads(Path(a.merge).read_text())
    fresh = {(r["model"], r["n"], r["config"]) for r in results["runs"]}
    kept = [r for r in prev["runs"] if (r["model"], r["n"], r["config"]) not in fresh]
    commands = _commands(prev) + results["commands"]
    return {**results, "runs": kept + results["runs"], "commands": commands, "machine": prev["machine"]}


def _commands(results: dict) -> list[dict]:
    """The commands behind a results file (files from before commands were recorded: the default run)."""
    if "commands" in results:
        return results["commands"]
    default = f"QDBG_PEERS_PYTHON={_bench.PEERS_PYTHON} {_bench.QDBG_PYTHON} benchmarks/calibration.py"
    return [{"command": default, "date": results.get("date", "?"), "commit": results.get("commit", "?")}]


def _reclassify(results: dict) -> dict:
    """Re-reads the logs of failed runs (when still there) so the report quotes the real cause."""
    for r in results["runs"]:
        if r["status"] not in ("ok", "timeout") and Path(r.get("log", "")).is_file():
            text = Path(r["log"]).read_text(errors="replace")
            r["status"], r["error"] = _bench._classify(1, False, text, {})
    return results


def main(argv: list[str] | None = None) -> int:
    a = parse(argv)
    if a.versions:
        versions(a.result)
        return 0
    if a.child:
        child(a.child, a.model_path, a.data_path, a.batch_size, a.result)
        return 0
    if a.render:
        results = _reclassify(json.loads(Path(a.render).read_text()))
        results["commands"] = _commands(results)
    else:
        missing = [m for m in a.models if not _bench.MODELS[m].onnx.exists()]
        if missing:
            print(f"zoo models missing under {_bench.ZOO}: {missing}; build them first "
                  "(benchmarks/README.md)", file=sys.stderr)
            return 2
        command = (f"QDBG_PEERS_PYTHON={_bench.PEERS_PYTHON} {sys.executable} benchmarks/calibration.py "
                   + " ".join(sys.argv[1:])).strip()
        results = {"commands": [{"command": command, "date": time.strftime("%Y-%m-%d"),
                                 "commit": _bench.git_commit()}], "machine": _bench.machine(),
                   "batch_size": a.batch_size, "mem_gib": a.mem_gib, "timeout": a.timeout}
        results.update(measure(a))
        results["load_end"] = _bench.os.getloadavg()[0]
        if a.merge:
            results = _merged(a, results)
    text = markdown(results)
    print(text)
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=1) + "\n")
    if a.md:
        _bench.write_section(Path(a.md), "Calibration cost", text)
    return 0


if __name__ == "__main__":
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # a crashed child must not dump GBs of core
    sys.exit(main())
