"""Where quantdbg and ModelOpt put their Q/DQ pairs, on the zoo models.

Each model is quantized twice, each tool in its own child process: quantdbg
(``quantdbg.api.quantize``, default QuantConfig, entropy) in this interpreter, ModelOpt
(``modelopt.onnx.quantization.quantize(quantize_mode="int8")``, its default TensorRT-guided
placement, entropy, CPU provider, ``high_precision_dtype="fp32"``) in the peers venv
(benchmarks/setup_peers.sh), both on the same first ``--n`` calibration samples (default 128, or
all the zoo has). Placement does not depend on the calibrator; the scales do.

Both Q/DQ models are then read back with the same code: every DequantizeLinear is followed to
the node inputs it feeds, each such input is traced back to the original tensor (through the
QuantizeLinear, or to the INT8/FP32 initializer for weights) and the consuming node is mapped to
its node in the FP32 model by its output tensor (names as a fallback), so "which node input is
quantized" is compared on the original graph. Reported per model: Q and DQ node counts,
quantized inputs per consumer op type (activations / weights), weight granularity, the nodes
only one tool quantizes, nodes both quantize but on different inputs, and -- where the zoo has a
task -- each Q/DQ model's task metrics from its builder's ``--eval`` (run in the builders' venv,
``$QDBG_BUILDER_PYTHON``, default /tmp/qdbg_venv/bin/python; ``--no-eval`` skips them).

  python benchmarks/placement.py [--models ...] [--n 128]

Writes the Q/DQ models to ``--out-dir`` (default /tmp/qdbg_placement/<model>/{quantdbg,modelopt}.onnx),
ModelOpt's MiniLM-L6 also to $QDBG_MODELS/minilm_l6_v2_text/modelopt_int8.onnx (for the
sensitivity analysis of a ModelOpt model), the raw comparison to ``--json`` (default
benchmarks/placement_results.json) and the "Q/DQ placement vs ModelOpt" section of ``--md``
(default benchmarks/RESULTS.md).
"""
from __future__ import annotations

import argparse
import ast
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _bench  # noqa: E402

DEFAULT_MODELS = ("digits_cnn", "resnet50_shape", "minilm_l6_v2_text", "silero_vad_16k")
TOOLS = ("quantdbg", "modelopt")
BATCH = 16
SHOW = 12  # node names listed per difference in RESULTS.md; the JSON has them all
BUILDERS = Path(os.environ.get("QDBG_BUILDERS", _bench.REPO.parent / "shared" / "models"))
BUILDER_PYTHON = Path(os.environ.get("QDBG_BUILDER_PYTHON", "/tmp/qdbg_venv/bin/python"))
EVAL_SCRIPTS = {"digits_cnn": "digits_cnn_train.py", "minilm_l6_v2_text": "minilm_l6_v2_text.py",
                "silero_vad_16k": "silero_vad_speech.py"}  # the ResNet-50-shaped CNN has random weights


# --------------------------------------------------------------------------------------------
# children: quantize with one tool


def _samples(name: str, n: int) -> tuple[dict, bool]:
    """The first ``n`` calibration samples; True when each sample is a whole feed (Silero VAD)."""
    import numpy as np

    model = _bench.MODELS[name]
    with np.load(model.calib, allow_pickle=False) as z:
        unbatched = "_unbatched" in z.files
        return {k: z[k][:n] for k in model.inputs}, unbatched


def _quantdbg(name: str, n: int, out: Path) -> dict:
    from quantdbg.config import CalibConfig
    from quantdbg.qdq import quantize

    arrays, unbatched = _samples(name, n)
    count = len(next(iter(arrays.values())))
    data = [{k: v[i] for k, v in arrays.items()} for i in range(count)] if unbatched else arrays
    qmodel = quantize(str(_bench.MODELS[name].onnx), data, calib=CalibConfig(method="entropy"),
                      batch_size=None if unbatched else BATCH)
    qmodel.save(out)
    return {"n_records": len(qmodel.records)}


def _modelopt(name: str, n: int, out: Path) -> dict:
    from modelopt.onnx.quantization import quantize

    arrays, unbatched = _samples(name, n)
    if unbatched:  # one feed per sample: concatenate on axis 0, one sample's shape per step
        shapes = ",".join(f"{k}:" + "x".join(map(str, v.shape[1:])) for k, v in arrays.items())
        arrays = {k: v.reshape(-1, *v.shape[2:]) for k, v in arrays.items()}
    else:
        shapes = ",".join(f"{k}:" + "x".join(map(str, (BATCH, *v.shape[1:]))) for k, v in arrays.items())
    tmp = Path(tempfile.mkdtemp(prefix="qdbg_place_"))
    try:  # ModelOpt rewrites the file it is given (through a symlink too): give it a copy
        shutil.copyfile(_bench.MODELS[name].onnx, tmp / "model.onnx")
        quantize(str(tmp / "model.onnx"), quantize_mode="int8", calibration_data=arrays,
                 calibration_method="entropy", calibration_shapes=shapes, calibration_eps=["cpu"],
                 high_precision_dtype="fp32", output_path=str(out), log_level="WARNING")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return {}


def child(tool: str, name: str, n: int, out: str, result: str) -> None:
    t0 = time.perf_counter()
    if tool == "modelopt":
        _bench.pin_ort_threads()
        rec = _modelopt(name, n, Path(out))
    else:
        rec = _quantdbg(name, n, Path(out))
    rec.update(ok=True, seconds=round(time.perf_counter() - t0, 2))
    Path(result).write_text(json.dumps(rec))


# --------------------------------------------------------------------------------------------
# analysis: the same code reads both tools' models


def _fp32_index(fp32) -> tuple[dict, dict]:
    by_output = {o: n for n in fp32.graph.node for o in n.output if o}
    by_name = {n.name: n for n in fp32.graph.node if n.name}
    return by_output, by_name


def _origin(tensor: str, producers: dict, inits: dict) -> tuple[str, str]:
    """(kind, original tensor) of what a DequantizeLinear's input carries."""
    if tensor in inits:
        return "weight", tensor
    q = producers.get(tensor)
    if q is not None and q.op_type == "QuantizeLinear":
        src = q.input[0]
        const = src in inits or (producers.get(src) is not None and producers[src].op_type == "Constant")
        return ("weight" if const else "activation"), src
    return "activation", tensor


def qdq_sites(path: Path, fp32_path: Path) -> dict:
    """Every node input fed by a DequantizeLinear, keyed by the FP32 node that owns it."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    fp32 = onnx.load(str(fp32_path), load_external_data=False)
    by_output, by_name = _fp32_index(fp32)
    inits = {i.name: i for i in model.graph.initializer}
    producers = {o: n for n in model.graph.node for o in n.output}
    consumers: dict[str, list] = {}
    for node in model.graph.node:
        for i, t in enumerate(node.input):
            consumers.setdefault(t, []).append((node, i))
    ops = Counter(n.op_type for n in model.graph.node)
    sites: dict[str, dict] = {}
    for dq in (n for n in model.graph.node if n.op_type == "DequantizeLinear"):
        kind, origin = _origin(dq.input[0], producers, inits)
        scale = inits.get(dq.input[1])
        per_channel = scale is not None and len(scale.dims) == 1 and scale.dims[0] > 1
        zp = inits.get(dq.input[2]) if len(dq.input) > 2 and dq.input[2] else None
        zp_type = onnx.helper.tensor_dtype_to_np_dtype(zp.data_type).name if zp is not None else "none"
        for node, index in consumers.get(dq.output[0], []):
            if node.op_type in ("QuantizeLinear", "DequantizeLinear"):
                continue
            owner = _owner(node, by_output, by_name)
            site = sites.setdefault(owner, {"op": node.op_type, "inputs": {}})
            site["inputs"][str(index)] = {"kind": kind, "tensor": origin, "per_channel": per_channel,
                                          "zero_point": zp_type}
    return {"n_quantize": ops["QuantizeLinear"], "n_dequantize": ops["DequantizeLinear"], "sites": sites,
            "opset": next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)}


def _owner(node, by_output: dict, by_name: dict) -> str:
    for out in node.output:
        if out in by_output:
            return by_output[out].name or out
    if node.name in by_name:
        return node.name
    return f"(new {node.op_type}) {node.name or node.output[0]}"


def per_op(sites: dict) -> dict[str, dict[str, int]]:
    """Op type -> {"activation": n, "weight": n, "nodes": n} quantized inputs."""
    table: dict[str, Counter] = {}
    for site in sites.values():
        row = table.setdefault(site["op"], Counter())
        row["nodes"] += 1
        for inp in site["inputs"].values():
            row[inp["kind"]] += 1
    return {op: dict(row) for op, row in sorted(table.items())}


def compare(a: dict, b: dict) -> dict:
    """Nodes quantized by only one tool, and nodes both quantize on different inputs."""
    sa, sb = a["sites"], b["sites"]
    only_a = sorted(set(sa) - set(sb))
    only_b = sorted(set(sb) - set(sa))
    differ = {}
    for node in sorted(set(sa) & set(sb)):
        ia, ib = sa[node]["inputs"], sb[node]["inputs"]
        gran = {i for i in set(ia) & set(ib) if ia[i]["per_channel"] != ib[i]["per_channel"]}
        if set(ia) != set(ib) or gran:
            differ[node] = {"op": sa[node]["op"], "quantdbg_inputs": sorted(ia),
                            "modelopt_inputs": sorted(ib), "granularity_differs": sorted(gran)}
    return {"only_quantdbg": [(n, sa[n]["op"]) for n in only_a],
            "only_modelopt": [(n, sb[n]["op"]) for n in only_b], "differ": differ,
            "both": len(set(sa) & set(sb))}


def task_metrics(name: str, model: Path) -> dict | None:
    """The zoo builder's own ``--eval`` of a model (None when there is no builder or venv)."""
    script = BUILDERS / EVAL_SCRIPTS.get(name, "-")
    if not script.is_file() or not BUILDER_PYTHON.exists():
        return None
    done = subprocess.run([str(BUILDER_PYTHON), str(script), "--eval", str(model)], capture_output=True,
                          text=True, env={**os.environ, **_bench.ONE_THREAD_ENV})
    if done.returncode != 0:
        return {"error": (done.stderr.strip().splitlines() or ["failed"])[-1][:200]}
    last = done.stdout.strip().splitlines()[-1].replace("np.float64(", "(")
    return {k: round(float(v), 4) for k, v in ast.literal_eval(last).items()}


# --------------------------------------------------------------------------------------------
# parent


def run(args: argparse.Namespace) -> dict:
    out_root = Path(args.out_dir)
    logs = out_root / "logs"
    report: dict = {"models": {}}
    for name in args.models:
        model = _bench.MODELS[name]
        entry: dict = {"runs": {}}
        for tool in TOOLS:
            out = out_root / name / f"{tool}.onnx"
            out.parent.mkdir(parents=True, exist_ok=True)
            python = _bench.PEERS_PYTHON if tool == "modelopt" else _bench.QDBG_PYTHON
            cmd = [str(Path(__file__).resolve()), "--child", tool, "--model", name, "--n", str(args.n),
                   "--out", str(out)]
            res = _bench.run_child(python, cmd, logs / f"{name}_{tool}.log", args.mem_gib, args.timeout)
            entry["runs"][tool] = {"status": res.status, "error": res.error, "path": str(out),
                                   "seconds": res.result.get("seconds"), "peak_rss_mib": res.peak_rss_mib}
            if res.status == "ok":
                entry[tool] = qdq_sites(out, model.onnx)
                entry[tool]["per_op"] = per_op(entry[tool]["sites"])
                entry[tool]["task"] = task_metrics(name, out) if args.eval else None
            print(f"{name:>18} {tool:<9} {res.status} {res.result.get('seconds')} s {res.error[:100]}",
                  flush=True)
        if "quantdbg" in entry and "modelopt" in entry:
            entry["compare"] = compare(entry["quantdbg"], entry["modelopt"])
        if name == "minilm_l6_v2_text" and "modelopt" in entry:
            dest = model.dir / "modelopt_int8.onnx"
            shutil.copyfile(entry["runs"]["modelopt"]["path"], dest)
            entry["runs"]["modelopt"]["copied_to"] = str(dest)
        entry["fp32_task"] = task_metrics(name, model.onnx) if args.eval else None
        report["models"][name] = entry
    return report


def _fmt(metrics: dict | None) -> str:
    return ", ".join(f"{k} {v}" for k, v in (metrics or {}).items()) or "--"


def _names(items: list, limit: int = SHOW) -> str:
    shown = ", ".join(f"`{n}` ({op})" for n, op in items[:limit])
    return shown + (f", ... {len(items) - limit} more" if len(items) > limit else "")


def _model_section(name: str, entry: dict) -> list[str]:
    out = [f"### {name}", ""]
    for tool in TOOLS:
        run = entry["runs"][tool]
        if run["status"] != "ok":
            out.append(f"- {tool}: **{run['status']}** -- `{run['error']}`")
            continue
        t = entry[tool]
        weights = [i for s in t["sites"].values() for i in s["inputs"].values() if i["kind"] == "weight"]
        acts = [i for s in t["sites"].values() for i in s["inputs"].values() if i["kind"] == "activation"]
        zps = Counter(i["zero_point"] for i in acts)
        out.append(f"- {tool}: {t['n_quantize']} QuantizeLinear / {t['n_dequantize']} DequantizeLinear, "
                   f"{len(acts) + len(weights)} quantized node inputs on {len(t['sites'])} nodes "
                   f"(opset {t['opset']}); weights per-channel {sum(w['per_channel'] for w in weights)}"
                   f"/{len(weights)}; activation zero points {dict(zps)}; {run['seconds']} s"
                   + (f"; task metrics {_fmt(t['task'])} (FP32 {_fmt(entry.get('fp32_task'))})"
                      if t.get("task") else "") + ".")
    out.append("")
    if "compare" not in entry:
        return out
    ops = sorted(set(entry["quantdbg"]["per_op"]) | set(entry["modelopt"]["per_op"]))
    out += ["| consumer op | quantdbg nodes / act. inputs / weights "
            "| ModelOpt nodes / act. inputs / weights |", "|---|---|---|"]
    for op in ops:
        cells = []
        for tool in TOOLS:
            row = entry[tool]["per_op"].get(op, {})
            cells.append(f"{row.get('nodes', 0)} / {row.get('activation', 0)} / {row.get('weight', 0)}")
        out.append(f"| {op} | " + " | ".join(cells) + " |")
    c = entry["compare"]
    out += ["", f"Quantized by both: {c['both']} nodes.",
            f"Only quantdbg ({len(c['only_quantdbg'])}): {_names(c['only_quantdbg']) or '--'}.",
            f"Only ModelOpt ({len(c['only_modelopt'])}): {_names(c['only_modelopt']) or '--'}."]
    differ = list(c["differ"].items())
    shown = [f"`{n}` ({d['op']}: quantdbg {d['quantdbg_inputs']}, ModelOpt {d['modelopt_inputs']}"
             + (f", per-channel differs on {d['granularity_differs']}" if d["granularity_differs"] else "")
             + ")" for n, d in differ[:SHOW]]
    more = f", ... {len(differ) - SHOW} more" if len(differ) > SHOW else ""
    out.append(f"Both, on different inputs or granularity ({len(differ)}): {', '.join(shown) or '--'}{more}.")
    return [*out, ""]


def markdown(report: dict, command: str) -> str:
    ours, peers = report["versions"]["qdbg"], report["versions"]["peers"]
    out = [f"Command (repo root, {report['date']}, commit {report['commit']}):", "",
           "```", command, "```", "",
           f"quantdbg {ours.get('quantdbg')} (onnxruntime {ours.get('onnxruntime')}) vs nvidia-modelopt "
           f"{peers.get('nvidia-modelopt')} (onnxruntime {peers.get('onnxruntime')} CPU). Both calibrated "
           f"with entropy on the first {report['n']} calibration samples (or all the zoo has); ModelOpt with "
           "its default placement and `high_precision_dtype=\"fp32\"`, quantdbg with its default "
           "QuantConfig. "
           "Inputs are counted as node inputs fed by a DequantizeLinear, mapped onto the FP32 graph's nodes; "
           "input indices are the consuming node's (0 = data, 1 = weight for Conv/Gemm). Node names are "
           "the FP32 model's. A DequantizeLinear read by several nodes counts for each reader: ModelOpt "
           "quantizes a tensor once for all its consumers, so nodes that merely read it (Shape, for "
           "instance) appear as quantized inputs too. A one-channel weight scale counts as per-tensor.", ""]
    for name, entry in report["models"].items():
        out += _model_section(name, entry)
    return "\n".join(out) + "\n"


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description="Q/DQ placement of quantdbg vs ModelOpt on the zoo models.")
    ap.add_argument("--models", nargs="+", choices=sorted(_bench.MODELS), default=list(DEFAULT_MODELS))
    ap.add_argument("--n", type=int, default=128, help="calibration samples (capped at what the zoo has)")
    ap.add_argument("--out-dir", default=str(Path(tempfile.gettempdir()) / "qdbg_placement"))
    ap.add_argument("--mem-gib", type=float, default=14.0)
    ap.add_argument("--timeout", type=float, default=1800.0)
    ap.add_argument("--no-eval", dest="eval", action="store_false",
                    help="skip the zoo builders' task metrics of each Q/DQ model")
    ap.add_argument("--json", default=str(_bench.HERE / "placement_results.json"))
    ap.add_argument("--md", default=str(_bench.HERE / "RESULTS.md"))
    ap.add_argument("--child", choices=TOOLS, help=argparse.SUPPRESS)
    ap.add_argument("--model", choices=sorted(_bench.MODELS), help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    a = parse(argv)
    if a.child:
        child(a.child, a.model, a.n, a.out, a.result)
        return 0
    import calibration  # for the versions child

    logs = Path(a.out_dir) / "logs"
    report = {"date": time.strftime("%Y-%m-%d"), "commit": _bench.git_commit(), "n": a.n,
              "versions": {"peers": calibration._versions(_bench.PEERS_PYTHON, logs),
                           "qdbg": calibration._versions(_bench.QDBG_PYTHON, logs)}}
    report.update(run(a))
    command = (f"QDBG_PEERS_PYTHON={_bench.PEERS_PYTHON} {sys.executable} benchmarks/placement.py "
               + " ".join(sys.argv[1:])).strip()
    text = markdown(report, command)
    print(text)
    Path(a.json).write_text(json.dumps(report, indent=1) + "\n")
    _bench.write_section(Path(a.md), "Q/DQ placement vs ModelOpt", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
