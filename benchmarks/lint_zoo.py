"""``quantdbg lint`` on the zoo's Q/DQ models, three quantizers side by side.

For each zoo model present (digits_cnn, minilm_l6_v2_text, silero_vad_16k, resnet50_shape; absent
ones are skipped), Q/DQ models are produced one at a time, each in its own child process:

- ``quantdbg``: ``quantdbg.api.quantize(model, load_npz(calib.npz, inputs=..., limit=N),
  CalibConfig(method="minmax"))`` with the default QuantConfig (Silero VAD's calibration clips are
  whole feeds, so it gets a list of feeds instead of ``load_npz``).
- ``ort-default``: ONNX Runtime ``quantize_static``, QDQ format, ``per_channel=True``, MinMax, and
  ONNX Runtime's defaults otherwise: every op type it knows how to quantize, QInt8 activations and
  weights, asymmetric activations, int32 biases.
- ``ort-weighted``: the same with ``op_types_to_quantize=["Conv", "MatMul", "Gemm"]``.
- ``modelopt``: ``$QDBG_MODELS/<name>/modelopt_int8.onnx`` when it exists; otherwise, when the
  peers venv can import ``modelopt.onnx.quantization``, ``quantize(quantize_mode="int8",
  calibration_method="max", high_precision_dtype="fp32", calibration_eps=["cpu"])`` on a copy of
  the model in a scratch folder (ModelOpt rewrites the file it is given).

Every quantizer sees the first ``--n`` calibration samples (default 128, or all the zoo has).
Each Q/DQ model is then linted in this process with :func:`quantdbg.lint.lint` (``--repeat``
times, the median reported: ``lint`` itself, loading and shape inference included) and once
through the CLI, ``quantdbg lint MODEL --json OUT --fail-on never``, whose JSON must equal the
API's report. Per model and quantizer: Q and DQ node counts, Q/DQ pairs by what they carry
(activation, weight, bias), findings per severity and per rule, the first nodes of each rule,
and the lint time.

  python benchmarks/lint_zoo.py [--models ...] [--n 128] [--out DIR] [--json OUT.json] [--no-write]

Q/DQ models go in ``--out`` (default: a scratch folder removed at the end), never in the
repository; the "Q/DQ lint on the zoo" section of ``--md`` (default benchmarks/RESULTS.md) is
replaced (or appended), every other section is left as is.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _bench  # noqa: E402

DEFAULT_MODELS = ("digits_cnn", "minilm_l6_v2_text", "silero_vad_16k", "resnet50_shape")
CONFIGS = ("quantdbg", "ort-default", "ort-weighted", "modelopt")
ORT_WEIGHTED_OPS = ["Conv", "MatMul", "Gemm"]
BATCH = 16
SECTION = "Q/DQ lint on the zoo"
SHOW_NODES = 3  # nodes listed per rule in RESULTS.md; the JSON has them all
# Rules about where the pairs sit (what TensorRT can fuse), as opposed to how they are encoded
# (types, zero points, scales) or what they cost in accuracy or kernel choice.
WEIGHTED = ("Conv", "ConvTranspose", "Gemm", "MatMul")
# Activations TensorRT fuses into the preceding convolution/GEMM when nothing sits between them.
EPILOGUE_OPS = ("Relu", "Clip", "LeakyRelu", "Sigmoid", "Tanh", "HardSigmoid", "HardSwish")
PLACEMENT_RULES = ("partially-quantized-op", "dq-into-float-op", "add-without-producer",
                   "concat-scale-mismatch", "qdq-on-weighted-output", "quantized-graph-output")


# --------------------------------------------------------------------------------------------
# children: produce one Q/DQ model


def _samples(name: str, n: int) -> tuple[dict, bool]:
    """The first ``n`` calibration samples; True when each sample is a whole feed (Silero VAD)."""
    import numpy as np

    model = _bench.MODELS[name]
    with np.load(model.calib, allow_pickle=False) as z:
        return {k: z[k][:n] for k in model.inputs}, "_unbatched" in z.files


def _feeds(arrays: dict, unbatched: bool) -> list[dict]:
    count = len(next(iter(arrays.values())))
    if unbatched:
        return [{k: v[i] for k, v in arrays.items()} for i in range(count)]
    return [{k: v[i:i + BATCH] for k, v in arrays.items()} for i in range(0, count, BATCH)]


def _quantdbg(name: str, n: int, src: Path, out: Path) -> dict:
    from quantdbg.config import CalibConfig
    from quantdbg.data import load_npz
    from quantdbg.qdq import quantize

    model = _bench.MODELS[name]
    arrays, unbatched = _samples(name, n)
    data = (_feeds(arrays, True) if unbatched
            else load_npz(model.calib, batch_size=BATCH, limit=n, inputs=model.inputs))
    qmodel = quantize(str(src), data, CalibConfig(method="minmax"))
    qmodel.save(out)
    return {"n_records": len(qmodel.records)}


def _ort(name: str, n: int, src: Path, out: Path, op_types: list[str] | None) -> dict:
    from onnxruntime.quantization import (
        CalibrationDataReader,
        CalibrationMethod,
        QuantFormat,
        quantize_static,
    )

    class Reader(CalibrationDataReader):
        def __init__(self, feeds: list[dict]) -> None:
            self.feeds, self.it = feeds, iter(feeds)

        def get_next(self) -> dict | None:
            return next(self.it, None)

        def rewind(self) -> None:
            self.it = iter(self.feeds)

    reader = Reader(_feeds(*_samples(name, n)))
    quantize_static(str(src), str(out), reader, quant_format=QuantFormat.QDQ, op_types_to_quantize=op_types,
                    per_channel=True, calibrate_method=CalibrationMethod.MinMax)
    return {}


def _modelopt(name: str, n: int, src: Path, out: Path) -> dict:
    import logging

    from modelopt.onnx.quantization import quantize

    arrays, unbatched = _samples(name, n)
    if unbatched:  # one feed per sample: concatenate on axis 0, one sample's shape per step
        shapes = ",".join(f"{k}:" + "x".join(map(str, v.shape[1:])) for k, v in arrays.items())
        arrays = {k: v.reshape(-1, *v.shape[2:]) for k, v in arrays.items()}
    else:
        shapes = ",".join(f"{k}:" + "x".join(map(str, (BATCH, *v.shape[1:]))) for k, v in arrays.items())
    quantize(onnx_path=str(src), quantize_mode="int8", calibration_data=arrays, calibration_method="max",
             calibration_shapes=shapes, calibration_eps=["cpu"], high_precision_dtype="fp32",
             output_path=str(out), log_level="WARNING")
    logging.shutdown()
    return {}


def child(config: str, name: str, n: int, out: str, result: str) -> None:
    """Quantizes ``name`` with ``config`` into ``out`` and writes what it did to ``result``."""
    t0 = time.perf_counter()
    _bench.pin_ort_threads()
    tmp = Path(tempfile.mkdtemp(prefix="qdbg_lintzoo_"))
    try:  # every tool gets a copy: ModelOpt saves its shape-inferred graph over the path it is given
        src = tmp / "model.onnx"
        shutil.copyfile(_bench.MODELS[name].onnx, src)
        if config == "quantdbg":
            rec = _quantdbg(name, n, src, Path(out))
        elif config == "modelopt":
            rec = _modelopt(name, n, src, Path(out))
        else:
            rec = _ort(name, n, src, Path(out), ORT_WEIGHTED_OPS if config == "ort-weighted" else None)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    rec.update(ok=True, seconds=round(time.perf_counter() - t0, 2))
    Path(result).write_text(json.dumps(rec))


def modelopt_importable() -> bool:
    """Whether the peers venv can import ModelOpt's ONNX quantizer."""
    if not _bench.PEERS_PYTHON.exists():
        return False
    probe = subprocess.run([str(_bench.PEERS_PYTHON), "-c", "import modelopt.onnx.quantization"],
                           capture_output=True, timeout=600, env={**os.environ, **_bench.ONE_THREAD_ENV})
    return probe.returncode == 0


# --------------------------------------------------------------------------------------------
# parent: count the pairs, lint


def qdq_counts(path: Path, fp32: Path) -> dict:
    """Q and DQ nodes, DQ nodes by what they carry (activation, weight, int32 bias), weighted ops
    whose output is quantized, and the other op types the quantizer added or removed."""
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph
    before = Counter(node.op_type for node in onnx.load(str(fp32), load_external_data=False).graph.node)
    consts = {i.name: i.data_type for i in graph.initializer}
    producers = {o: node for node in graph.node for o in node.output}
    for node in graph.node:
        if node.op_type == "Constant":
            consts[node.output[0]] = next((a.t.data_type for a in node.attribute if a.name == "value"), 0)
    kinds: Counter = Counter()
    for dq in (node for node in graph.node if node.op_type == "DequantizeLinear"):
        src = dq.input[0]
        q = producers.get(src)
        if q is not None and q.op_type == "QuantizeLinear":
            src = q.input[0]
        if src not in consts:
            kinds["activation"] += 1
        else:
            kinds["bias" if consts[src] == onnx.TensorProto.INT32 else "weight"] += 1
    ops = Counter(node.op_type for node in graph.node)
    by_input: dict[str, list] = {}
    for node in graph.node:
        for name in node.input:
            by_input.setdefault(name, []).append(node)
    weighted_out, into_activation = 0, []
    for node in graph.node:
        qs = [q for q in by_input.get(node.output[0], []) if q.op_type == "QuantizeLinear"]
        if node.op_type not in WEIGHTED or not qs:
            continue
        weighted_out += 1
        dqs = [dq for q in qs for dq in by_input.get(q.output[0], []) if dq.op_type == "DequantizeLinear"]
        acts = [r.op_type for dq in dqs for r in by_input.get(dq.output[0], []) if r.op_type in EPILOGUE_OPS]
        if acts:
            into_activation.append([node.name or node.output[0], acts[0]])
    from quantdbg.diagnostics.lint_rules import FLOAT_ONLY_OPS, INT8_CAPABLE_OPS

    # Readers of a DQ that the lint's op tables do not classify: no rule speaks about them.
    known = INT8_CAPABLE_OPS | FLOAT_ONLY_OPS | {"DequantizeLinear"}
    unclassified = Counter(r.op_type for dq in graph.node if dq.op_type == "DequantizeLinear"
                           for r in by_input.get(dq.output[0], []) if r.op_type not in known)
    changed = {op: ops[op] - before[op] for op in sorted(set(ops) | set(before))
               if ops[op] != before[op] and op not in ("QuantizeLinear", "DequantizeLinear")}
    return {"n_quantize": ops["QuantizeLinear"], "n_dequantize": ops["DequantizeLinear"],
            "pairs": {k: kinds[k] for k in ("activation", "weight", "bias")}, "n_nodes": len(graph.node),
            "weighted_outputs_quantized": weighted_out, "weighted_outputs_into_activation": into_activation,
            "ops_changed": changed, "dq_readers_unclassified": dict(sorted(unclassified.items()))}


def lint_timed(path: Path, repeat: int) -> dict:
    """The lint report and the median (and minimum) time of ``lint`` itself over ``repeat`` runs."""
    from quantdbg.diagnostics import lint
    from quantdbg.errors import QuantDbgError

    times, report = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        try:
            report = lint(path)
        except QuantDbgError as err:
            return {"status": "error", "error": f"{type(err).__name__}: {err}"}
        times.append(time.perf_counter() - t0)
    assert report is not None
    by_rule: dict[str, list[str]] = {}
    for finding in report.findings:
        by_rule.setdefault(finding.check, []).append(finding.subjects[0])
    return {"status": "ok", "counts": report.counts(), "by_rule": by_rule, "report": report.to_dict(),
            "lint_s": round(statistics.median(times), 3), "lint_min_s": round(min(times), 3)}


def add_context(path: Path, adds: list[str]) -> dict[str, dict]:
    """For each named Add (an ``add-without-producer`` finding): the op types reading its output, and
    the weighted op reaching a float input through a bias Add (MatMul -> Add(constant) -> this Add)."""
    import onnx

    from quantdbg.model.names import name_nodes

    graph = name_nodes(onnx.load(str(path), load_external_data=False)).graph
    consts = {i.name for i in graph.initializer}
    producer = {o: node for node in graph.node for o in node.output}
    readers: dict[str, list[str]] = {}
    for node in graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node.op_type)
    out = {}
    for node in (n for n in graph.node if n.name in adds):
        via_bias = None
        for name in node.input:
            bias_add = producer.get(name)
            if bias_add is None or bias_add.op_type != "Add" or not any(i in consts for i in bias_add.input):
                continue
            weighted = [producer[i].name for i in bias_add.input
                        if i in producer and producer[i].op_type in WEIGHTED]
            via_bias = weighted[0] if weighted else via_bias
        out[node.name] = {"readers": sorted(set(readers.get(node.output[0], []))), "via_bias_add": via_bias}
    return out


def lint_cli(path: Path, json_out: Path, expected: dict) -> dict:
    """Runs ``quantdbg lint`` once; its JSON must equal the API's report."""
    cmd = [str(_bench.QDBG_PYTHON), "-m", "quantdbg", "lint", str(path), "--json", str(json_out),
           "--fail-on", "never"]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **_bench.ONE_THREAD_ENV})
    wall = time.perf_counter() - t0
    same = json_out.exists() and json.loads(json_out.read_text()) == expected
    return {"exit": proc.returncode, "wall_s": round(wall, 2), "json_matches_api": same,
            "stderr": proc.stderr.strip()[-300:]}


def produce(name: str, config: str, args: argparse.Namespace, out_dir: Path) -> tuple[Path | None, dict]:
    """The Q/DQ model of ``config`` for ``name`` (made in a child, or ModelOpt's existing file)."""
    existing = _bench.MODELS[name].dir / "modelopt_int8.onnx"
    if config == "modelopt" and existing.exists():
        stamp = time.strftime("%Y-%m-%d %H:%M", time.localtime(existing.stat().st_mtime))
        return existing, {"status": "ok", "source": f"existing {existing} ({stamp})"}
    if config == "modelopt" and not args.modelopt_ok:
        return None, {"status": "skipped", "error": "no modelopt_int8.onnx and the peers venv lacks ModelOpt"}
    out = out_dir / name / f"{config}.onnx"
    out.parent.mkdir(parents=True, exist_ok=True)
    python = _bench.PEERS_PYTHON if config == "modelopt" else _bench.QDBG_PYTHON
    cmd = [str(Path(__file__).resolve()), "--child", config, "--model", name, "--n", str(args.n),
           "--out", str(out)]
    res = _bench.run_child(python, cmd, out_dir / "logs" / f"{name}_{config}.log", args.mem_gib, args.timeout)
    info = {"status": res.status, "error": res.error, "source": "made here",
            "quantize_s": res.result.get("seconds"), "peak_rss_mib": res.peak_rss_mib}
    return (out if res.status == "ok" else None), info


def run(args: argparse.Namespace, out_dir: Path) -> dict:
    """Produces and lints every (model, quantizer); returns the raw results."""
    models: dict = {}
    for name in args.models:
        if not _bench.MODELS[name].onnx.exists():
            print(f"{name:>18} absent, skipped", flush=True)
            continue
        models[name] = {}
        for config in args.configs:
            path, entry = produce(name, config, args, out_dir)
            if path is not None:
                entry.update(qdq_counts(path, _bench.MODELS[name].onnx))
                entry["lint"] = lint_timed(path, args.repeat)
                if entry["lint"]["status"] == "ok":
                    json_out = out_dir / "lint_json" / f"{name}_{config}.json"
                    json_out.parent.mkdir(parents=True, exist_ok=True)
                    entry["cli"] = lint_cli(path, json_out, entry["lint"]["report"])
                    adds = entry["lint"]["by_rule"].get("add-without-producer", [])
                    entry["add_context"] = add_context(path, adds) if adds else {}
            models[name][config] = entry
            lint = entry.get("lint", {})
            print(f"{name:>18} {config:<13} {entry['status']:<7} {lint.get('counts', lint.get('error', ''))} "
                  f"lint {lint.get('lint_s')} s {entry.get('error', '')[:100]}", flush=True)
    return models


# --------------------------------------------------------------------------------------------
# report


def _rules_cell(by_rule: dict[str, list[str]]) -> str:
    from quantdbg.diagnostics import RULES

    order = list(RULES)
    rules = sorted(by_rule, key=lambda r: order.index(r) if r in order else len(order))
    return ", ".join(f"`{r}` {len(by_rule[r])}" for r in rules) or "--"


def _row(config: str, entry: dict) -> str:
    if entry["status"] != "ok":
        return f"| {config} | **{entry['status']}**: {entry.get('error', '')[:120]} | | | | | |"
    pairs = entry["pairs"]
    lint = entry["lint"]
    cells = [config, f"{entry['n_quantize']} / {entry['n_dequantize']}",
             f"{pairs['activation']} / {pairs['weight']} / {pairs['bias']}",
             str(entry["weighted_outputs_quantized"])]
    if lint["status"] != "ok":
        return "| " + " | ".join([*cells, f"**lint failed**: {lint['error'][:160]}", "", ""]) + " |"
    c = lint["counts"]
    cli = entry.get("cli", {})
    cli_note = "" if cli.get("json_matches_api") else " (CLI JSON differs!)"
    cells += [f"{c['high']} / {c['medium']} / {c['info']}", _rules_cell(lint["by_rule"]),
              f"{lint['lint_s']:.2f} ({cli.get('wall_s', '?')}){cli_note}"]
    return "| " + " | ".join(cells) + " |"


def _top_nodes(config: str, entry: dict) -> str:
    lint = entry.get("lint", {})
    if lint.get("status") != "ok" or not lint["by_rule"]:
        return ""
    parts = []
    for rule, nodes in lint["by_rule"].items():
        more = f", +{len(nodes) - SHOW_NODES}" if len(nodes) > SHOW_NODES else ""
        parts.append(f"`{rule}`: " + ", ".join(f"`{n}`" for n in nodes[:SHOW_NODES]) + more)
    return f"- {config}: " + "; ".join(parts)


def verdict(entry: dict) -> str:
    """"clean" when nothing stops TensorRT from fusing every pair, else the rules that do."""
    lint = entry.get("lint", {})
    if entry["status"] != "ok" or lint.get("status") != "ok":
        return "--"
    by_rule = lint["by_rule"]
    errors = [r for r in by_rule if lint_severity(r) == "high"]
    placement = [r for r in PLACEMENT_RULES if r in by_rule]
    if not errors and not placement:
        return "clean"
    blocking = [f"`{r}` {len(by_rule[r])}" for r in [*errors, *placement]]
    return ("build fails: " if errors else "unfused: ") + ", ".join(blocking)


def lint_severity(rule: str) -> str:
    from quantdbg.diagnostics import RULES

    return RULES[rule].severity.value if rule in RULES else "?"


SETTING = (
    "First {n} calibration samples (or all the zoo has), MinMax / max calibration everywhere. "
    "quantdbg: `quantdbg.api.quantize(..., CalibConfig(method=\"minmax\"))`, default QuantConfig. "
    "ort-default: `quantize_static(quant_format=QDQ, per_channel=True, calibrate_method=MinMax)`, "
    "everything else ONNX Runtime's default (all op types it quantizes, QInt8 with asymmetric "
    "activations, int32 biases). ort-weighted: the same with "
    "`op_types_to_quantize=[\"Conv\", \"MatMul\", \"Gemm\"]`. modelopt: "
    "`modelopt.onnx.quantization.quantize(quantize_mode=\"int8\", calibration_method=\"max\", "
    "high_precision_dtype=\"fp32\")` with its default placement, or the zoo's existing "
    "`modelopt_int8.onnx` where there is one (source below the model's table)."
)
COLUMNS = (
    "Columns: Q / DQ = QuantizeLinear / DequantizeLinear nodes; pairs = DequantizeLinear nodes by what "
    "they carry, activation / weight / int32 bias (a weight stored as INT8 has a DQ and no Q); "
    "weighted outputs Q'd = Conv/Gemm/MatMul nodes whose output feeds a QuantizeLinear (not a fault by "
    "itself: a projection shortcut Conv read as INT8 by the residual Add fuses); H / M / I = "
    "lint findings of high / medium / info severity; lint s = median of {repeat} "
    "`quantdbg.lint.lint(path)` calls in one process (loading, checker and shape inference included), in "
    "parentheses the wall time of one "
    "`quantdbg lint MODEL --json OUT --fail-on never` process (interpreter start included), whose JSON "
    "equals the API's report unless marked."
)


def markdown(report: dict, command: str) -> str:
    """The RESULTS.md section: command, setting, one table per model, verdicts, reading."""
    ours, peers = report["versions"]["qdbg"], report["versions"]["peers"]
    versions = (f"quantdbg {ours.get('quantdbg')} with onnxruntime {ours.get('onnxruntime')} (quantdbg "
                f"and ONNX Runtime quantizers, and the lint); nvidia-modelopt {peers.get('nvidia-modelopt')} "
                f"with onnxruntime {peers.get('onnxruntime')} CPU.")
    out = [f"Command (repo root, {report['date']}, commit {report['commit']}):", "",
           "```", command, "```", "", versions + " " + SETTING.format(n=report["n"]), "",
           COLUMNS.format(repeat=report["repeat"]), ""]
    for name, entries in report["models"].items():
        out += _model_section(name, entries)
    out += _verdict_table(report)
    out += interpretation(report)
    return "\n".join(out) + "\n"


def _model_section(name: str, entries: dict) -> list[str]:
    out = [f"### {name}", "", "| quantizer | Q / DQ | pairs act / weight / bias | weighted outputs Q'd "
           "| H / M / I | findings per rule | lint s (CLI s) |", "|---|---|---|---|---|---|---|"]
    out += [_row(config, entry) for config, entry in entries.items()]
    out += ["", "First nodes per rule:", ""]
    out += [line for config, entry in entries.items() if (line := _top_nodes(config, entry))]
    notes = [f"Source of {config}: {entry['source']}." for config, entry in entries.items()
             if entry.get("source", "").startswith("existing")]
    for config, entry in entries.items():
        if entry.get("ops_changed"):
            changes = ", ".join(f"{op} {n:+d}" for op, n in entry["ops_changed"].items())
            notes.append(f"{config} changed other ops: {changes}.")
    return [*out, "", *notes, ""] if notes else [*out, ""]


def _verdict_table(report: dict) -> list[str]:
    configs = list(dict.fromkeys(c for entries in report["models"].values() for c in entries))
    out = ["### Would TensorRT fuse every pair?", "",
           "\"clean\": no error and no placement finding (" + ", ".join(f"`{r}`" for r in PLACEMENT_RULES)
           + "); otherwise the rules that stop it. `per-tensor-weight` (accuracy) and `channel-alignment` "
           "(kernel choice) do not stop fusion and are left out here.", "",
           "| model | " + " | ".join(configs) + " |", "|---|" + "---|" * len(configs)]
    for name, entries in report["models"].items():
        out.append(f"| {name} | " + " | ".join(verdict(entries[c]) if c in entries else "--" for c in configs)
                   + " |")
    return [*out, ""]


# What each rule means for these quantizers, for the reading of the table (the rule itself
# says what it detects; this says why a quantizer trips it).
WHY = {
    "nonzero-zero-point": "asymmetric activations (ONNX Runtime's default `ActivationSymmetric=False`); "
                          "TensorRT's parser rejects a non-zero zero point, so no engine is built",
    "non-int8-qdq-type": "int32 DequantizeLinear on biases (ONNX Runtime's default `QuantizeBias=True`); "
                         "TensorRT quantizes biases itself and takes INT8 DQ inputs only",
    "dq-into-float-op": "DQ feeding ops with no INT8 kernel, each an unfused dequantize layer",
    "qdq-on-weighted-output": "a weighted op's output quantized and then read in float",
    "add-without-producer": "a quantized Add whose inputs all come through DQs and whose output is float, so "
                            "it cannot fuse into the weighted op before it",
    "quantized-graph-output": "the graph output produced by a DQ (the last layer's output quantized)",
    "partially-quantized-op": "a weighted op with one input dequantized and the other float",
    "concat-scale-mismatch": "Concat inputs with different scales",
    "channel-alignment": "channel counts not multiples of 16 (kernel choice, not fusion)",
    "per-tensor-weight": "per-tensor weight scales (accuracy, not fusion)",
}


def _totals(report: dict, config: str) -> dict:
    """Findings per rule summed over the models, models linted and clean, with the models per rule."""
    rules: Counter = Counter()
    where: dict[str, list[str]] = {}
    linted = clean = 0
    for name, entries in report["models"].items():
        entry = entries.get(config, {})
        if entry.get("lint", {}).get("status") != "ok":
            continue
        linted += 1
        clean += verdict(entry) == "clean"
        for rule, nodes in entry["lint"]["by_rule"].items():
            rules[rule] += len(nodes)
            where.setdefault(rule, []).append(name)
    return {"rules": rules, "where": where, "linted": linted, "clean": clean}


def interpretation(report: dict) -> list[str]:
    """Per quantizer: how many models TensorRT would fuse cleanly, and why not elsewhere (rule ids)."""
    configs = list(dict.fromkeys(c for entries in report["models"].values() for c in entries))
    totals = {config: _totals(report, config) for config in configs}
    clean = [c for c, t in totals.items() if t["linted"] and t["clean"] == t["linted"]]
    out = ["### Reading the findings", "",
           "Placement TensorRT would fuse cleanly on every model linted: "
           + (", ".join(f"**{c}**" for c in clean) or "none") + ". Per quantizer, every rule that fired, "
           "summed over the models:", ""]
    for config, t in totals.items():
        if not t["linted"]:
            continue
        line = f"- **{config}**: clean on {t['clean']} of {t['linted']} models."
        for rule, n in sorted(t["rules"].items(), key=lambda kv: -kv[1]):
            line += (f" `{rule}` {n} ({', '.join(t['where'][rule])}): {WHY.get(rule, lint_severity(rule))}.")
        out.append(line)
    caveats = _caveats(report)
    if caveats:
        out += ["", "Where the lint may be wrong, or silent:", "", *caveats]
    return [*out, ""]


FOLDED_RELU = (
    "- {name}, {config}: the quantizer deleted {removed} nodes (a Relu after a quantized op is folded "
    "into the asymmetric QuantizeLinear's clamp at its zero point), so the fix for `nonzero-zero-point` "
    "is to quantize again symmetrically, never to set the zero points to 0."
)
RESIDUAL_ADD = (
    "- {name}, {config}: {n} `add-without-producer` findings are residual Adds read by a "
    "LayerNormalization (e.g. `{first}`). ModelOpt quantizes such an Add on purpose, as the head of a "
    "pointwise partition after a MatMul partition (`modelopt/onnx/quantization/graph_utils.py`, "
    "`filter_quantizable_kgen_heads`), expecting TensorRT's generated kernels to fuse the DQs, the Add "
    "and the LayerNorm. The lint follows the Developer Guide (an Add fuses into a weighted producer, or "
    "with a Q on its output); which one is right is for a TensorRT engine inspector to settle."
)
BIAS_HOP = (
    "- {name}, {config}: {n} `add-without-producer` findings are Adds with a float input straight from "
    "a weighted op plus its bias Add (e.g. `{add}` after `{weighted}` -> Add(bias), the way torch exports "
    "nn.Linear on 3-D inputs). The rule looks one node back, so it does not see the weighted producer; "
    "TensorRT fuses the bias into the GEMM, so these are likely false positives."
)
UNCLASSIFIED = (
    "- {name}, {config}: DequantizeLinear outputs are read by ops the lint lists neither as INT8-capable "
    "nor as float-only ({ops}), so no rule looks at them; an LSTM/GRU/RNN among them has no INT8 "
    "kernel in TensorRT and is a missed `dq-into-float-op`."
)
UNFLAGGED_OUTPUTS = (
    "- {name}, {config}: {n} weighted-op output(s) quantized right before an activation that "
    "TensorRT otherwise fuses into the layer (e.g. `{first}` -> Q/DQ -> {act}); `qdq-on-weighted-output` "
    "does not flag them because it counts the activation as INT8-capable. Whether TensorRT then runs the "
    "activation as a separate INT8 layer is not spelled out by the guide the rule cites; an engine "
    "inspector would tell."
)


def _caveats(report: dict) -> list[str]:
    """Where the data shows the lint's limits: findings it may get wrong, patterns it does not flag."""
    out = []
    for name, entries in report["models"].items():
        for config, entry in entries.items():
            lint = entry.get("lint", {})
            if lint.get("status") != "ok":
                continue
            removed = {op: -n for op, n in entry["ops_changed"].items() if n < 0}
            if removed:
                what = ", ".join(f"{n} {op}" for op, n in removed.items())
                out.append(FOLDED_RELU.format(name=name, config=config, removed=what))
            context = entry.get("add_context", {})
            into_norm = [add for add, c in context.items() if "LayerNormalization" in c["readers"]]
            via_bias = [(add, c["via_bias_add"]) for add, c in context.items() if c["via_bias_add"]]
            if via_bias:
                out.append(BIAS_HOP.format(name=name, config=config, n=len(via_bias), add=via_bias[0][0],
                                           weighted=via_bias[0][1]))
            if into_norm and config == "modelopt":
                out.append(RESIDUAL_ADD.format(name=name, config=config, n=len(into_norm),
                                               first=into_norm[0]))
            if entry["dq_readers_unclassified"]:
                ops = ", ".join(f"{op} {n}" for op, n in entry["dq_readers_unclassified"].items())
                out.append(UNCLASSIFIED.format(name=name, config=config, ops=ops))
            flagged = set(lint["by_rule"].get("qdq-on-weighted-output", []))
            missed = [(n, act) for n, act in entry["weighted_outputs_into_activation"] if n not in flagged]
            if missed:
                out.append(UNFLAGGED_OUTPUTS.format(name=name, config=config, n=len(missed),
                                                    first=missed[0][0], act=missed[0][1]))
    return out


# --------------------------------------------------------------------------------------------
# main


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description="quantdbg lint on the zoo's Q/DQ models from three quantizers.")
    ap.add_argument("--models", nargs="+", choices=sorted(_bench.MODELS), default=list(DEFAULT_MODELS))
    ap.add_argument("--configs", nargs="+", choices=CONFIGS, default=list(CONFIGS))
    ap.add_argument("--n", type=int, default=128, help="calibration samples (capped at what the zoo has)")
    ap.add_argument("--out", help="folder for the Q/DQ models and logs (default: a scratch folder, removed)")
    ap.add_argument("--repeat", type=int, default=3, help="lint calls per model; the median is reported")
    ap.add_argument("--mem-gib", type=float, default=10.0)
    ap.add_argument("--timeout", type=float, default=1800.0)
    ap.add_argument("--json", help="also write the raw results here")
    ap.add_argument("--md", default=str(_bench.HERE / "RESULTS.md"))
    ap.add_argument("--no-write", action="store_true", help="print the section, do not touch --md")
    ap.add_argument("--child", choices=CONFIGS, help=argparse.SUPPRESS)
    ap.add_argument("--model", choices=sorted(_bench.MODELS), help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    a = parse(argv)
    if a.child:
        child(a.child, a.model, a.n, a.out, a.result)
        return 0
    import calibration  # its versions child

    out_dir = Path(a.out) if a.out else Path(tempfile.mkdtemp(prefix="qdbg_lintzoo_"))
    out_dir.mkdir(parents=True, exist_ok=True)
    try:
        a.modelopt_ok = "modelopt" in a.configs and modelopt_importable()
        logs = out_dir / "logs"
        report = {"date": time.strftime("%Y-%m-%d"), "commit": _bench.git_commit(), "n": a.n,
                  "repeat": a.repeat,
                  "versions": {"qdbg": calibration._versions(_bench.QDBG_PYTHON, logs),
                               "peers": calibration._versions(_bench.PEERS_PYTHON, logs)}}
        report["models"] = run(a, out_dir)
    finally:
        if not a.out:
            shutil.rmtree(out_dir, ignore_errors=True)
    command = f"QDBG_PEERS_PYTHON={_bench.PEERS_PYTHON} {sys.executable} benchmarks/lint_zoo.py " + " ".join(
        sys.argv[1:])
    text = markdown(report, command.strip())
    print(text)
    if a.json:
        Path(a.json).write_text(json.dumps(report, indent=1) + "\n")
    if not a.no_write:
        _bench.write_section(Path(a.md), SECTION, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
