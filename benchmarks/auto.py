"""`quantdbg auto` on the zoo, in the forms real exporters write weights in, beside ModelOpt.

For each zoo model and each export form (tests/export_forms.py: initializers as exported, every
weight in a Constant node, MatMul/Gemm weights behind a Transpose, FP16 initializers behind Cast),
one run of the automatic flow (entropy calibration, INT8 repairs, ranking, search, verification)
with the model's task metric and a target of at most 1 % relative loss against FP32:

* digits CNN: top-1 accuracy on the 540 held-out digits;
* MiniLM-L6: retrieval MRR of the 351 first-sentence queries against their paragraphs;
* Silero VAD: frame ROC-AUC of the 32 speech-in-noise clips.

Recorded per run: FP32, default INT8, repaired and final metric, the layers kept out of INT8 (share
of the quantized layers), the task-metric evaluations per phase, the repairs kept, wall time. With
``QDBG_PEERS_PYTHON`` pointing at the peers venv (benchmarks/setup_peers.sh), ModelOpt's INT8
(entropy, all defaults) of the same form is scored beside it.

    python benchmarks/auto.py                      # every model and form; RESULTS.md section "auto"
    python benchmarks/auto.py --models digits_cnn --forms constants --no-write
    python benchmarks/auto.py --rows /tmp/auto_rows.jsonl   # resumable: recorded runs are skipped
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnx

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))
import export_forms  # noqa: E402
from _bench import git_commit, machine  # noqa: E402
from _zoo_tasks import ZOO, ZooTask, load_task, mrr, run_command, silero_auc, write_section  # noqa: E402

import quantdbg  # noqa: E402
from quantdbg.evaluation import Accuracy, OutputFunction  # noqa: E402
from quantdbg.fallback import FallbackTarget  # noqa: E402
from quantdbg.pipeline import AutoConfig  # noqa: E402

FORMS = {"digits_cnn": ("initializers", "constants", "transposed", "fp16"),
         "minilm_l6_v2_text": ("initializers", "constants"),
         "silero_vad_16k": ("initializers", "constants")}
MAX_REL_LOSS = 1.0
PEERS_PYTHON = os.environ.get("QDBG_PEERS_PYTHON", "/work/peers_venv/bin/python")


def task_metric(name: str, labels: np.ndarray | None) -> Any:
    """The model's task metric, scored in the analysis session.

    Each also scores a leading part of the evaluation set (the output-space ranking scores the
    first samples only): MiniLM's pairs are interleaved (query, its paragraph, ...), Silero's frame
    labels are cut to the clips scored.
    """
    if name == "digits_cnn":
        return Accuracy(labels)
    if name == "minilm_l6_v2_text":
        return OutputFunction(pair_mrr, "retrieval MRR")
    return OutputFunction(lambda out, ref: silero_auc({"p": out["speech_probs"]},
                                                      labels.reshape(-1)[:out["speech_probs"].size]),
                          "frame ROC-AUC")


def pair_mrr(outputs: dict[str, np.ndarray], reference: dict[str, np.ndarray]) -> float:
    """MRR of each query's own paragraph among the paragraphs scored, rows interleaved query/paragraph
    (the builder's MRR on the whole set: a rank does not depend on the order of the pairs)."""
    emb = outputs["sentence_embedding"].astype(np.float64)
    return mrr(emb[0::2], emb[1::2])


def bench_task(name: str, work: Path) -> ZooTask:
    """The zoo task, MiniLM's evaluation rows interleaved (query, its paragraph) for :func:`pair_mrr`."""
    loaded = load_task(name, work / "zoo")
    if name != "minilm_l6_v2_text":
        return loaded
    n = len(next(iter(loaded.eval.values()))) // 2
    pairs = {k: np.stack([a[:n], a[n:]], axis=1).reshape(2 * n, *a.shape[1:]) for k, a in loaded.eval.items()}
    return ZooTask(loaded.name, loaded.model, loaded.calib, pairs, None, None)


def _summary(result: Any) -> dict[str, Any]:
    plan = result.plan
    excluded = list(result.model.excluded) if result.model is not None else []
    return {"outcome": result.outcome, "message": result.message, "fp32": result.fp32_value,
            "int8": result.int8_value, "repaired": result.repaired_value, "final": result.final_value,
            "n_layers": result.n_layers, "excluded": excluded,
            "share": len(excluded) / result.n_layers if result.n_layers else 0.0,
            "evaluations": dict(result.evaluations), "n_evaluations": sum(result.evaluations.values()),
            "repairs": [r.to_dict() for r in result.recipe.repairs] if result.recipe is not None else [],
            "strategy": None if plan is None else plan.strategy, "seconds": round(result.seconds, 1)}


def modelopt_metric(name: str, model: Path, work: Path) -> float | None:
    """ModelOpt INT8 (entropy) of ``model`` scored by the same task metric, or None without the peers venv."""
    if not Path(PEERS_PYTHON).is_file():
        return None
    out = work / "modelopt.onnx"
    code = ("import sys, shutil; from modelopt.onnx.quantization import quantize; import numpy as np\n"
            "src, calib, out = sys.argv[1:]; c = dict(np.load(calib))\n"
            "quantize(src, quantize_mode='int8', calibration_method='entropy', calibration_data=c, "
            "output_path=out, calibration_eps=['cpu'])\n")
    calib = work / "peer_calib.npz"
    task = bench_task(name, work)
    if not isinstance(task.calib, dict):
        return None  # a feed list (Silero's recurrent state) is not an array ModelOpt takes
    np.savez(calib, **task.calib)
    copy = work / "peer_model.onnx"  # ModelOpt rewrites the file it is given
    copy.write_bytes(model.read_bytes())
    done = subprocess.run([PEERS_PYTHON, "-c", code, str(copy), str(calib), str(out)], capture_output=True,
                          text=True, timeout=3600)
    if done.returncode != 0 or not out.exists():
        print(f"modelopt failed on {model}: {done.stderr[-500:]}", file=sys.stderr)
        return None
    return score_file(name, out, task)


def score_file(name: str, path: Path, task: Any) -> float:
    """The task metric of a model file, with ONNX Runtime (Q/DQ as ONNX defines it)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.add_session_config_entry("session.disable_quant_qdq", "1")
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    n = 0 if isinstance(task.eval, list) else len(next(iter(task.eval.values())))
    feeds = task.eval if isinstance(task.eval, list) else [
        {k: v[i:i + 32] for k, v in task.eval.items()} for i in range(0, n, 32)]
    outs = [dict(zip(names, session.run(None, feed), strict=True)) for feed in feeds]
    outputs = {k: np.concatenate([o[k] for o in outs]) for k in names}
    metric = task_metric(name, task.labels)
    return float(metric.from_outputs(outputs, outputs)) if not isinstance(metric, Accuracy) else \
        float((outputs[names[0]].argmax(-1) == task.labels).mean())


def run(name: str, form: str, work: Path, max_rel_loss: float = MAX_REL_LOSS) -> dict[str, Any]:
    """One automatic-flow run on one form of one zoo model."""
    task = bench_task(name, work)
    model = export_forms.form(onnx.load(str(task.model)), form)
    path = work / f"{name}_{form}.onnx"
    onnx.save(model, str(path))
    target = FallbackTarget.max_relative_loss(max_rel_loss)
    start = time.perf_counter()
    result = quantdbg.auto(str(path), task.calib, task.eval, target, metric=task_metric(name, task.labels),
                           config=AutoConfig(threads=0))
    row = {"model": name, "form": form, "max_rel_loss": max_rel_loss, **_summary(result),
           "wall_s": round(time.perf_counter() - start, 1)}
    row["modelopt_int8"] = modelopt_metric(name, path, work)
    shown = ("model", "form", "fp32", "int8", "final", "share", "n_evaluations")
    print(json.dumps({k: row[k] for k in shown}), file=sys.stderr, flush=True)
    return row


def _machine() -> str:
    m = machine()
    return f"{m['cpu']}, {m['cores']} cores, {m['mem_gib']} GiB"


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4f}"


def section(rows: list[dict[str, Any]], command: str) -> str:
    """The RESULTS.md section."""
    lines = ["## The automatic flow on real export forms (`quantdbg auto`)", "",
             f"Command: `{command}` (commit {git_commit()}). Machine: {_machine()}.", "",
             f"Target: task metric within {MAX_REL_LOSS:g} % of FP32 (unless the row says otherwise: a "
             "tighter target makes the search run on a real model); default INT8 = entropy calibration, "
             "all Conv/ConvTranspose/Gemm/MatMul; ModelOpt = `modelopt.onnx.quantization.quantize` int8 "
             "entropy on the same file (peers venv), scored by the same metric.", "",
             "| model | form | FP32 | ModelOpt INT8 | default INT8 | repaired | auto | kept out of INT8 | "
             "evaluations | outcome | time |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        evals = ", ".join(f"{k} {v}" for k, v in r["evaluations"].items() if v)
        form = r["form"] if r.get("max_rel_loss", MAX_REL_LOSS) == MAX_REL_LOSS else \
            f"{r['form']}, target {r['max_rel_loss']:g} %"
        lines.append(f"| {r['model']} | {form} | {_fmt(r['fp32'])} | {_fmt(r['modelopt_int8'])} | "
                     f"{_fmt(r['int8'])} | {_fmt(r['repaired'])} | {_fmt(r['final'])} | "
                     f"{len(r['excluded'])}/{r['n_layers']} ({100 * r['share']:.0f} %) | "
                     f"{r['n_evaluations']} ({evals}) | {r['outcome']} | {r['wall_s']:.0f} s |")
    lines += ["", "Layers kept out of INT8 and repairs kept, per run:", ""]
    for r in rows:
        kept = [f"{rep['repair']}" for rep in r["repairs"] if rep.get("kept")]
        lines.append(f"- {r['model']} / {r['form']}: {', '.join(r['excluded']) or 'none'}; repairs kept: "
                     f"{', '.join(kept) or 'none'}. {r['message']}")
    return "\n".join(lines)


def _recorded(path: Path | None) -> list[dict[str, Any]]:
    if path is None or not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    built = [m for m in FORMS if (ZOO / m / "model.onnx").is_file()]
    parser.add_argument("--models", nargs="+", default=built)
    parser.add_argument("--forms", nargs="+", help="Only these forms.")
    parser.add_argument("--json", type=Path, default=HERE / "auto_results.json")
    parser.add_argument("--no-write", action="store_true", help="Print the section instead of writing it.")
    parser.add_argument("--max-rel-loss", type=float, default=MAX_REL_LOSS, help="Target: at most this "
                        "relative task-metric loss against FP32, in percent (default %(default)s).")
    parser.add_argument("--rows", type=Path, help="JSON-lines journal: each run's row is appended as it "
                        "ends, and runs already in it are not repeated (a killed benchmark resumes).")
    args = parser.parse_args()
    rows = _recorded(args.rows)
    done = {(r["model"], r["form"], r.get("max_rel_loss", MAX_REL_LOSS)) for r in rows}
    with tempfile.TemporaryDirectory(prefix="quantdbg-auto-bench-") as tmp:
        for name in args.models:
            for form in FORMS[name]:
                if (args.forms and form not in args.forms) or (name, form, args.max_rel_loss) in done:
                    continue
                rows.append(run(name, form, Path(tmp), args.max_rel_loss))
                if args.rows is not None:
                    with args.rows.open("a") as journal:
                        journal.write(json.dumps(rows[-1], sort_keys=True) + "\n")
    order = {(m, f): i for i, (m, f) in enumerate((m, f) for m in FORMS for f in FORMS[m])}
    rows = sorted((r for r in rows if r["model"] in args.models),
                  key=lambda r: (order[r["model"], r["form"]], -r.get("max_rel_loss", MAX_REL_LOSS)))
    text = section(rows, run_command("auto.py", Path(tempfile.gettempdir()), report_only=False))
    if args.no_write:
        print(text)
        return 0
    args.json.write_text(json.dumps(rows, indent=1, sort_keys=True) + "\n")
    write_section("auto", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
