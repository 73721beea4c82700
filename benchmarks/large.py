"""Large models: peak memory and time of quantization as the weights grow past protobuf's 2 GB.

Generated MatMul stacks (tests/models_large.py: 4096 x 4096 float32 layers with ReLU between,
seeded weights written straight to ``model.onnx.data``) of the sizes asked for. For each size, every
configuration runs in its own child process, one at a time, under an address-space cap:

- ``floor``: one FP32 ONNX Runtime session built from the path plus one pass over the samples;
- ``quantdbg-minmax``, ``quantdbg-entropy``: ``quantdbg.quantize`` + ``QuantizedModel.save``
  (external data, as the input);
- ``quantdbg-analyze-local``: the same calibration (minmax) then ``analyze_sensitivity`` in
  ``local`` mode on the evaluation samples (evidence included), as ``quantdbg analyze`` does;
- ``quantdbg-fallback``: ``quantdbg fallback --method minmax --min-sqnr 25 --precision fp32`` (the
  same calibration, the local ranking, the search and the mixed model's check and save);
- ``ort-minmax``: ``onnxruntime.quantization.quantize_static`` (QDQ, per-channel symmetric INT8,
  MatMul) with ``use_external_data_format=True``, in the peers venv;
- ``modelopt-max``: ``modelopt.onnx.quantization.quantize(quantize_mode="int8")`` on a copy of the
  model (it writes beside its input), in the peers venv.

Cells: peak RSS of the child / weight bytes, and wall time / the floor's wall time. ONNX Runtime
uses one intra-op thread everywhere. The analysis and fallback children also record a digest of
what they return (the report; the plan and the mixed model's files, wall times, peak memory and
scratch paths left out), so a ``before:`` run shows whether a change kept the results.

  python benchmarks/large.py --sizes 0.3 1.2 [--configs floor quantdbg-minmax] [--md benchmarks/RESULTS.md]
  python benchmarks/large.py --from-json small.json large.json --md benchmarks/RESULTS.md  # one table

The section keeps its hand-written ``###`` subsections when ``--md`` rewrites it.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))
import _bench  # noqa: E402

WIDTH = 4096
N_CALIB, N_EVAL, BATCH = 64, 32, 16
QDBG = ("floor", "quantdbg-minmax", "quantdbg-entropy", "quantdbg-analyze-local", "quantdbg-fallback")
PEERS = ("ort-minmax", "modelopt-max")
BEFORE = ("before:quantdbg-minmax", "before:quantdbg-analyze-local", "before:quantdbg-fallback")
"""quantdbg's configurations from another source tree (``--before SRC``), e.g. the commit before
a change: ``git archive COMMIT src | tar -x -C /tmp/before``."""
CONFIGS = (*QDBG, *PEERS, *BEFORE)
TITLE = "Large models"


# --------------------------------------------------------------------------------------------
# child side


def _batches(path: str) -> list[dict]:
    import numpy as np

    x = np.load(path)["x"]
    return [{"x": x[i:i + BATCH]} for i in range(0, len(x), BATCH)]


def _floor(model: str, folder: Path) -> None:
    import onnxruntime as ort

    session = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    for feed in _batches(str(folder / "calib.npz")):
        session.run(None, feed)


def _quantdbg(config: str, model: str, folder: Path, out: Path) -> dict:
    """Runs a quantdbg configuration; returns the digests of what it produced (analysis, fallback)."""
    from quantdbg import SensitivityConfig, analyze_sensitivity, quantize
    from quantdbg.config import CalibConfig

    if config == "quantdbg-fallback":
        return _fallback(model, folder, out)
    method = "entropy" if config.endswith("entropy") else "minmax"
    qmodel = quantize(model, folder / "calib.npz", CalibConfig(method=method))
    if config == "quantdbg-analyze-local":
        report = analyze_sensitivity(model, qmodel, folder / "eval.npz", SensitivityConfig(mode="local"))
        return {"report": _digest(_canonical(report.to_dict(), []))}
    qmodel.save(out)
    return {}


def _fallback(model: str, folder: Path, out: Path) -> dict:
    from quantdbg.cli import main as cli

    plan = out.parent / "plan.json"
    status = cli(["fallback", model, "--data", str(folder / "calib.npz"), "--eval", str(folder / "eval.npz"),
                  "--method", "minmax", "--min-sqnr", "25", "--precision", "fp32", "--out", str(out),
                  "--plan", str(plan)])
    if status != 0:
        raise RuntimeError(f"quantdbg fallback exited with status {status}")
    found = _canonical(json.loads(plan.read_text()), [str(out.parent), str(folder)])
    files = sorted(out.parent.glob(f"{out.name}*"))
    return {"plan": _digest(found), **{p.name: _file_digest(p) for p in files}}


_UNSTABLE = ("seconds", "footprint")
"""Result fields that vary from run to run: wall times and the measured peak memory."""


def _canonical(value: object, scratch: list[str]) -> object:
    """JSON data without the fields of :data:`_UNSTABLE`, with the scratch folders' paths made neutral."""
    if isinstance(value, dict):
        return {k: _canonical(v, scratch) for k, v in value.items() if k not in _UNSTABLE}
    if isinstance(value, list):
        return [_canonical(v, scratch) for v in value]
    if isinstance(value, str):
        for i, path in enumerate(scratch):
            value = value.replace(path, f"<scratch{i}>")
    return value


def _digest(value: object) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()[:16]


def _file_digest(path: Path) -> str:
    hasher = hashlib.sha256()
    with open(path, "rb") as data:
        for chunk in iter(lambda: data.read(2**24), b""):
            hasher.update(chunk)
    return hasher.hexdigest()[:16]


def _ort(model: str, folder: Path, out: Path) -> None:
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.it = iter(_batches(str(folder / "calib.npz")))

        def get_next(self):
            return next(self.it, None)

    quantize_static(model, str(out), Reader(), quant_format=QuantFormat.QDQ, op_types_to_quantize=["MatMul"],
                    per_channel=True, activation_type=QuantType.QInt8, weight_type=QuantType.QInt8,
                    use_external_data_format=True,
                    extra_options={"ActivationSymmetric": True, "WeightSymmetric": True})


def _modelopt(model: str, folder: Path, out: Path) -> None:
    import numpy as np
    from modelopt.onnx.quantization import quantize

    copy = out.parent / "input"  # ModelOpt writes intermediate files beside its input
    copy.mkdir()
    for name in ("model.onnx", "model.onnx.data"):
        shutil.copyfile(Path(model).parent / name, copy / name)
    x = np.load(folder / "calib.npz")["x"]
    quantize(str(copy / "model.onnx"), quantize_mode="int8", calibration_data={"x": x},
             calibration_method="max", calibration_shapes=f"x:{BATCH}x{WIDTH}", calibration_eps=["cpu"],
             high_precision_dtype="fp32", output_path=str(out), use_external_data_format=True,
             log_level="WARNING")


def child(config: str, folder: str, result: str) -> None:
    """Runs one configuration on ``folder/model.onnx`` and writes its measurements to ``result``."""
    _bench.pin_ort_threads()
    src = Path(folder)
    tmp = Path(tempfile.mkdtemp(prefix="qdbg_large_"))
    try:
        out, model = tmp / "quantized.onnx", str(src / "model.onnx")
        t0, outputs = time.perf_counter(), {}
        if config == "floor":
            _floor(model, src)
        elif config.startswith(("quantdbg", "before:")):
            outputs = _quantdbg(config.removeprefix("before:"), model, src, out)
        elif config == "ort-minmax":
            _ort(model, src, out)
        else:
            _modelopt(model, src, out)
        rec = {"work_s": time.perf_counter() - t0, "ok": True, "outputs": outputs,
               "out_bytes": sum(p.stat().st_size for p in tmp.glob("quantized.onnx*"))}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    Path(result).write_text(json.dumps(rec))


# --------------------------------------------------------------------------------------------
# parent side


def _generate(folder: Path, gb: float) -> int:
    import models_large
    import numpy as np

    models_large.matmul_stack(folder, int(gb * 1e9), WIDTH)
    np.savez(folder / "calib.npz", x=models_large.inputs(WIDTH, N_CALIB))
    np.savez(folder / "eval.npz", x=models_large.inputs(WIDTH, N_EVAL, seed=2))
    return (folder / "model.onnx.data").stat().st_size


def measure(args: argparse.Namespace) -> dict:
    results: dict = {"machine": _bench.machine(), "commit": _bench.git_commit(), "argv": _measuring_argv(),
                     "mem_gib": args.mem_gib, "available_gib": _available_gib(), "runs": []}
    for gb in args.sizes:
        with tempfile.TemporaryDirectory(prefix="qdbg_large_model_") as tmp:
            weights = _generate(Path(tmp), gb)
            for config in args.configs:
                if config in BEFORE and not args.before:
                    continue
                run = _run(config, tmp, gb, args)
                rec = {"size_gb": gb, "weight_bytes": weights, "config": config, **run.to_dict()}
                results["runs"].append(rec)
                print(f"{gb} GB {config}: {run.status} {run.wall_s:.1f} s, {run.peak_rss_mib / 1024:.2f} GiB "
                      f"{run.error}", flush=True)
    return results


def _available_gib() -> float | None:
    """The machine's available memory now (other work shares it), from /proc/meminfo where there is one."""
    try:
        lines = Path("/proc/meminfo").read_text().splitlines()
        line = next(ln for ln in lines if ln.startswith("MemAvailable:"))
    except (OSError, StopIteration):
        return None
    return round(int(line.split()[1]) / 2**20, 1)


def _run(config: str, folder: str, gb: float, args: argparse.Namespace) -> _bench.ChildRun:
    python = Path(args.peers_python) if config in PEERS else Path(sys.executable)
    saved = os.environ.get("PYTHONPATH")
    if config in BEFORE:  # the child imports quantdbg from the other source tree
        os.environ["PYTHONPATH"] = str(Path(args.before) / "src")
    try:
        script = str(Path(__file__).resolve())
        return _bench.run_child(python, [script, "--child", config, "--folder", folder],
                                Path(args.logs) / f"{gb}_{config.replace(':', '_')}.log", args.mem_gib,
                                args.timeout)
    finally:
        if saved is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = saved


def merge(measurements: list[dict]) -> dict:
    """Several measurement runs as one table: a later run of a (size, configuration) replaces an
    earlier one; every run keeps the index of the measurement (its source) it came from. The floor
    of every measurement is kept, so each cell's wall time is divided by its own run's floor."""
    runs: dict = {}
    floors: list[dict] = []
    for i, m in enumerate(measurements):
        for r in m["runs"]:
            runs[(r["size_gb"], r["config"])] = {**r, "source": i}
            floors += [{**r, "source": i}] if r["config"] == "floor" else []
    keys = ("machine", "commit", "argv", "mem_gib", "available_gib")
    return {"sources": [{k: m.get(k) for k in keys} for m in measurements], "runs": list(runs.values()),
            "floors": floors}


def _tag(run: dict, sources: list[dict]) -> str:
    return f" [{chr(ord('A') + run['source'])}]" if len(sources) > 1 else ""


def _cell(run: dict, floor: dict | None, tag: str) -> str:
    if run["status"] != "ok":
        return f"{run['status']}{tag} after {run['wall_s']:.0f} s (peak {run['peak_rss_mib'] / 1024:.2f} GiB)"
    rss = run["peak_rss_mib"] * 2**20 / run["weight_bytes"]
    wall = f"{run['wall_s'] / floor['wall_s']:.1f}x" if floor and floor["status"] == "ok" else "?"
    return f"{rss:.2f}x / {wall} ({run['peak_rss_mib'] / 1024:.2f} GiB, {run['wall_s']:.0f} s){tag}"


def _measuring_argv() -> list[str]:
    """This command line without the options that only render (so a re-render names the run)."""
    out, skip = [], False
    for arg in sys.argv[1:]:
        if arg.startswith("--"):
            skip = arg in ("--from-json", "--md")
        if not skip:
            out.append(arg)
    return out


def _commands(results: dict) -> list[str]:
    lines = ["Command (repo root), one per measurement run"
             + ("; a cell's letter names the run it comes from:" if len(results["sources"]) > 1 else ":"),
             "", "```"]
    for i, src in enumerate(results["sources"]):
        cap = f", address space capped at {src['mem_gib']} GiB per run" if src.get("mem_gib") else ""
        load = src["machine"]["loadavg"][0]
        argv = src.get("argv") or ["(arguments not recorded)"]
        free = f", {src['available_gib']} GiB available" if src.get("available_gib") else ""
        lines += [f"# {chr(ord('A') + i)}: commit {src['commit']}{cap}; at the start: 1-min load average "
                  f"{load:.1f}{free}", " ".join(["python benchmarks/large.py", *argv])]
    return [*lines, "```", ""]


def markdown(results: dict, args: argparse.Namespace) -> str:
    sizes = sorted({r["size_gb"] for r in results["runs"]})
    configs = [c for c in CONFIGS if any(r["config"] == c for r in results["runs"])]
    index = {(r["size_gb"], r["config"]): r for r in results["runs"]}
    weights = {gb: next(r["weight_bytes"] for r in results["runs"] if r["size_gb"] == gb) for gb in sizes}
    m = results["sources"][-1]["machine"]
    lines = [*_commands(results),
             f"Machine: {m['cpu']}, {m['cores']} cores, {m['mem_gib']} GiB, shared with other work while "
             "measured, so wall times are noisy (peak RSS is not).",
             f"Setting: MatMul stacks of {WIDTH} x {WIDTH} float32 layers, {N_CALIB} calibration samples "
             f"(analyze: {N_EVAL} evaluation samples), batch {BATCH}, ONNX Runtime on one intra-op thread; "
             "a run that needs more address space than its cap fails (`oom`) instead of taking the "
             "machine down.",
             "",
             "Cell = peak RSS / weight bytes and wall time / the FP32 floor's (peak RSS, wall time). "
             "quantdbg's analyze row includes its calibration (minmax), as `quantdbg analyze` does"
             + (f"; `before:` rows run {_before_trees(results, args)}."
                if any(c in BEFORE for c in configs) else "."), "",
             "| configuration | " + " | ".join(f"{gb} GB ({weights[gb] / 2**30:.2f} GiB)" for gb in sizes)
             + " |",
             "|---|" + "---|" * len(sizes)]
    floors = {(r["size_gb"], r["source"]): r for r in results["floors"]}
    for config in configs:
        runs = [index.get((gb, config)) for gb in sizes]
        cells = [_cell(run, floors.get((gb, run["source"])), _tag(run, results["sources"])) if run else "-"
                 for gb, run in zip(sizes, runs, strict=True)]
        lines.append(f"| {config} | " + " | ".join(cells) + " |")
    return "\n".join([*lines, "", *_failures(index, results["sources"]), *_reading(index, sizes)]) + "\n"


def _before_trees(results: dict, args: argparse.Namespace) -> str:
    """What the ``before:`` rows ran: the one tree, or, when runs measured different ones, each
    run's own (named by its ``--before-label`` on its command line above)."""
    labels = {_argv_value(src.get("argv") or [], "--before-label") for src in results["sources"]}
    labels.discard(None)
    if len(labels) > 1:
        return "the source tree their run's `--before-label` names (its command line above)"
    return f"the source tree of {labels.pop() if labels else args.before_label}"


def _argv_value(argv: list[str], option: str) -> str | None:
    """The words after ``option`` up to the next option (a label may be several words)."""
    if option not in argv:
        return None
    rest = argv[argv.index(option) + 1:]
    end = next((i for i, word in enumerate(rest) if word.startswith("--")), len(rest))
    return " ".join(rest[:end])


def _failures(index: dict, sources: list[dict]) -> list[str]:
    failed = [r for r in index.values() if r["status"] != "ok"]
    if not failed:
        return []
    lines = ["Failures (the child's last error line):", ""]
    for r in sorted(failed, key=lambda r: (r["size_gb"], CONFIGS.index(r["config"]))):
        cap = sources[r["source"]].get("mem_gib")
        lines.append(f"- {r['config']} at {r['size_gb']} GB: {r['status']}"
                     + (f" under the {cap} GiB cap" if r["status"] == "oom" and cap else "")
                     + f", `{r['error'].replace('`', '')}`")
    return [*lines, ""]


def _ratio(run: dict | None) -> float | None:
    return run["peak_rss_mib"] * 2**20 / run["weight_bytes"] if run and run["status"] == "ok" else None


def _largest(index: dict, sizes: list[float], config: str) -> list[str]:
    """Measured: the largest size that ran; extrapolated: 24 GiB over its peak RSS / weights (peak
    RSS grows with the weights, the rest is ~0.1 GiB)."""
    ran = [gb for gb in sizes if _ratio(index.get((gb, config)))]
    if not ran:
        return []
    run, gb = index[(ran[-1], config)], ran[-1]
    failed = [f"{g} GB ({index[(g, config)]['status']})" for g in sizes
              if g > gb and (g, config) in index]
    return [f"  - {config}: measured {gb} GB ({run['weight_bytes'] / 2**30:.2f} GiB of weights, peak "
            f"{run['peak_rss_mib'] / 1024:.2f} GiB)" + (f", failed at {', '.join(failed)}" if failed else "")
            + f"; extrapolated (not run): ~{24 / _ratio(run):.0f} GiB of weights"]


def _reading(index: dict, sizes: list[float]) -> list[str]:
    """What the table says, computed from it."""
    lines = ["Reading:", ""]
    both = [gb for gb in sizes if _ratio(index.get((gb, "quantdbg-minmax")))
            and _ratio(index.get((gb, "before:quantdbg-minmax")))]
    if both:
        gb = both[-1]
        after, before = index[(gb, "quantdbg-minmax")], index[(gb, "before:quantdbg-minmax")]
        lines.append(f"- quantdbg calibrate at {gb} GB: peak RSS {_ratio(before):.2f}x -> "
                     f"{_ratio(after):.2f}x the weights, wall {before['wall_s']:.0f} s -> "
                     f"{after['wall_s']:.0f} s: the weights stay in their data file, ONNX Runtime reads "
                     "them from there, the output streams them to `OUT.onnx.data`.")
    lines += _kept(index, sizes)
    lines.append("- Largest model that fits 24 GiB, per tool (measured: the largest size that ran under the "
                 "cap; extrapolated: 24 GiB / its peak RSS per weight byte):")
    for config in (*QDBG[1:], *PEERS, *BEFORE):
        lines += _largest(index, sizes, config)
    return lines


def _kept(index: dict, sizes: list[float]) -> list[str]:
    """Whether each configuration returned what its ``before:`` run returned (the recorded digests)."""
    lines = []
    for config in ("quantdbg-analyze-local", "quantdbg-fallback"):
        for gb in sizes:
            after, before = index.get((gb, config)), index.get((gb, f"before:{config}"))
            if not (_ratio(after) and _ratio(before)):
                continue
            got, want = after["result"].get("outputs"), before["result"].get("outputs")
            if not (got and want):
                continue
            same = "identical" if got == want else "DIFFERENT"
            lines.append(f"- {config} at {gb} GB: peak RSS {_ratio(before):.2f}x -> {_ratio(after):.2f}x the "
                         f"weights, wall {before['wall_s']:.0f} s -> {after['wall_s']:.0f} s; what it "
                         f"returns ({', '.join(sorted(got))}) is {same} to the `before:` run's.")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", choices=CONFIGS, help=argparse.SUPPRESS)
    parser.add_argument("--folder", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    parser.add_argument("--sizes", type=float, nargs="+", default=[0.3, 1.2])
    parser.add_argument("--configs", nargs="+", choices=CONFIGS, default=list(CONFIGS))
    parser.add_argument("--mem-gib", type=float, default=14.0)
    parser.add_argument("--timeout", type=float, default=1800.0)
    parser.add_argument("--peers-python", default="/work/peers_venv/bin/python")
    parser.add_argument("--logs", default=str(Path(tempfile.gettempdir()) / "qdbg_large_logs"))
    parser.add_argument("--before", metavar="DIR", help="A source tree (DIR/src) whose calibration is "
                        "measured too, as before:quantdbg-minmax.")
    parser.add_argument("--before-label", default="the --before tree", help="How the section names it.")
    parser.add_argument("--json", help="Write the raw measurements here.")
    parser.add_argument("--md", help="Write the section to this RESULTS.md.")
    parser.add_argument("--from-json", metavar="FILE", nargs="+", help="Render measurements --json "
                        "wrote; run nothing. Several files make one table, a later file's cell replacing "
                        "an earlier file's.")
    args = parser.parse_args(argv)
    if args.child:
        child(args.child, args.folder, args.result)
        return 0
    if args.from_json:
        results = merge([json.loads(Path(f).read_text()) for f in args.from_json])
    else:
        measured = measure(args)
        if args.json:
            Path(args.json).write_text(json.dumps(measured, indent=2))
        results = merge([measured])
    text = markdown(results, args)
    print(text)
    if args.md:
        _bench.write_section(Path(args.md), TITLE, text + _subsections(Path(args.md)))
    return 0


def _subsections(md: Path) -> str:
    """The section's hand-written ``###`` subsections, kept below the table when it is rewritten."""
    lines = md.read_text().splitlines() if md.exists() else []
    start = next((i for i, ln in enumerate(lines) if ln.strip() == f"## {TITLE}"), None)
    if start is None:
        return ""
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    sub = next((i for i in range(start + 1, end) if lines[i].startswith("### ")), end)
    return "\n" + "\n".join(lines[sub:end]) if sub < end else ""


if __name__ == "__main__":
    sys.exit(main())
