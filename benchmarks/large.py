"""Large models: peak memory and time of quantization as the weights grow past protobuf's 2 GB.

Generated MatMul stacks (tests/models_large.py: 4096 x 4096 float32 layers with ReLU between,
seeded weights written straight to ``model.onnx.data``) of the sizes asked for. For each size, every
configuration runs in its own child process, one at a time, under an address-space cap:

- ``floor``: one FP32 ONNX Runtime session built from the path plus one pass over the samples;
- ``quantdbg-minmax``, ``quantdbg-entropy``: ``quantdbg.quantize`` + ``QuantizedModel.save``
  (external data, as the input);
- ``quantdbg-analyze-local``: the same calibration (minmax) then ``analyze_sensitivity`` in
  ``local`` mode on the evaluation samples (evidence included), as ``quantdbg analyze`` does;
- ``ort-minmax``: ``onnxruntime.quantization.quantize_static`` (QDQ, per-channel symmetric INT8,
  MatMul) with ``use_external_data_format=True``, in the peers venv;
- ``modelopt-max``: ``modelopt.onnx.quantization.quantize(quantize_mode="int8")`` on a copy of the
  model (it writes beside its input), in the peers venv.

Cells: peak RSS of the child / weight bytes, and wall time / the floor's wall time. ONNX Runtime
uses one intra-op thread everywhere.

  python benchmarks/large.py --sizes 0.3 1.2 [--configs floor quantdbg-minmax] [--md benchmarks/RESULTS.md]
"""
from __future__ import annotations

import argparse
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
QDBG = ("floor", "quantdbg-minmax", "quantdbg-entropy", "quantdbg-analyze-local")
PEERS = ("ort-minmax", "modelopt-max")
BEFORE = ("before:quantdbg-minmax",)
"""quantdbg's calibration from another source tree (``--before SRC``), e.g. the commit before
external weights stayed lazy: ``git archive COMMIT src | tar -x -C /tmp/before``."""
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


def _quantdbg(config: str, model: str, folder: Path, out: Path) -> None:
    from quantdbg import SensitivityConfig, analyze_sensitivity, quantize
    from quantdbg.config import CalibConfig

    method = "entropy" if config.endswith("entropy") else "minmax"
    qmodel = quantize(model, folder / "calib.npz", CalibConfig(method=method))
    if config == "quantdbg-analyze-local":
        analyze_sensitivity(model, qmodel, folder / "eval.npz", SensitivityConfig(mode="local"))
    else:
        qmodel.save(out)


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
        t0 = time.perf_counter()
        if config == "floor":
            _floor(model, src)
        elif config.startswith(("quantdbg", "before:")):
            _quantdbg(config.removeprefix("before:"), model, src, out)
        elif config == "ort-minmax":
            _ort(model, src, out)
        else:
            _modelopt(model, src, out)
        rec = {"work_s": time.perf_counter() - t0, "ok": True,
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
    results: dict = {"machine": _bench.machine(), "commit": _bench.git_commit(), "runs": []}
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


def _cell(run: dict, floor: dict | None) -> str:
    if run["status"] != "ok":
        return f"{run['status']}: {run['error'][:80]}"
    rss = run["peak_rss_mib"] * 2**20 / run["weight_bytes"]
    wall = f"{run['wall_s'] / floor['wall_s']:.1f}x" if floor and floor["status"] == "ok" else "?"
    return f"{rss:.2f}x / {wall} ({run['peak_rss_mib'] / 1024:.2f} GiB, {run['wall_s']:.0f} s)"


def _measuring_argv() -> list[str]:
    """This command line without the options that only render (so a re-render names the run)."""
    argv, out = sys.argv[1:], []
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg in ("--from-json", "--md"):
            skip = True
        else:
            out.append(arg)
    return out


def markdown(results: dict, args: argparse.Namespace) -> str:
    sizes = sorted({r["size_gb"] for r in results["runs"]})
    configs = [c for c in CONFIGS if any(r["config"] == c for r in results["runs"])]
    index = {(r["size_gb"], r["config"]): r for r in results["runs"]}
    weights = {gb: next(r["weight_bytes"] for r in results["runs"] if r["size_gb"] == gb) for gb in sizes}
    m = results["machine"]
    lines = ["Command (repo root):", "", "```",
             f"# commit {results['commit']}", " ".join(["python benchmarks/large.py", *_measuring_argv()]),
             "```", "",
             f"Machine: {m['cpu']}, {m['cores']} cores, {m['mem_gib']} GiB, shared with other work while "
             f"measured (1-min load average {m['loadavg'][0]:.1f} at the start), so wall times are noisy.",
             f"Setting: MatMul stacks of {WIDTH} x {WIDTH} float32 layers, {N_CALIB} calibration samples "
             f"(analyze: {N_EVAL} evaluation samples), batch {BATCH}, ONNX Runtime on one intra-op thread, "
             f"address space capped at {args.mem_gib} GiB per run.", "",
             "Cell = peak RSS / weight bytes and wall time / the FP32 floor's (peak RSS, wall time). "
             "quantdbg's analyze row includes its calibration (minmax), as `quantdbg analyze` does"
             + (f"; `before:` rows run the source tree of {args.before_label}." if args.before else "."), "",
             "| configuration | " + " | ".join(f"{gb} GB ({weights[gb] / 2**30:.2f} GiB)" for gb in sizes)
             + " |",
             "|---|" + "---|" * len(sizes)]
    for config in configs:
        cells = [_cell(index[(gb, config)], index.get((gb, "floor"))) if (gb, config) in index else "-"
                 for gb in sizes]
        lines.append(f"| {config} | " + " | ".join(cells) + " |")
    return "\n".join([*lines, "", *_reading(index, sizes)]) + "\n"


def _ratio(run: dict | None) -> float | None:
    return run["peak_rss_mib"] * 2**20 / run["weight_bytes"] if run and run["status"] == "ok" else None


def _reading(index: dict, sizes: list[float]) -> list[str]:
    """What the table says, computed from it; the largest model for 24 GiB extrapolates the
    largest size's peak RSS / weights (peak RSS grows with the weights, the rest is ~0.1 GiB)."""
    top = sizes[-1]
    lines = ["Reading:", ""]
    after, before = index.get((top, "quantdbg-minmax")), index.get((top, "before:quantdbg-minmax"))
    if _ratio(after) and _ratio(before):
        lines.append(f"- quantdbg calibrate at {top} GB: peak RSS {_ratio(before):.2f}x -> "
                     f"{_ratio(after):.2f}x the weights, wall {before['wall_s']:.0f} s -> "
                     f"{after['wall_s']:.0f} s: the weights stay in their data file, ONNX Runtime reads "
                     "them from there, the output streams them to `OUT.onnx.data`.")
    lines.append("- Largest model that fits 24 GiB (extrapolated from the largest size measured, not run):")
    for config in ("quantdbg-minmax", "quantdbg-analyze-local", "ort-minmax", "modelopt-max"):
        ratio = _ratio(index.get((top, config)))
        if ratio:
            lines.append(f"  - {config}: ~{24 / ratio:.0f} GiB of weights")
    lines.append("- quantdbg analyze (local) is above its goal of the same order as calibrate: its graphs "
                 "hold fake-quantized copies of the weights (in memory and in the session), and the "
                 "output-space ranking's switchable graph selects weights with If nodes, which copy them "
                 "at every run.")
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
    parser.add_argument("--from-json", metavar="FILE", help="Render measurements --json wrote; run nothing.")
    args = parser.parse_args(argv)
    if args.child:
        child(args.child, args.folder, args.result)
        return 0
    results = json.loads(Path(args.from_json).read_text()) if args.from_json else measure(args)
    if args.json and not args.from_json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    text = markdown(results, args)
    print(text)
    if args.md:
        _bench.write_section(Path(args.md), TITLE, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
