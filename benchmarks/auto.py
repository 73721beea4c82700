"""`quantdbg auto` on the zoo, in the forms real exporters write weights in, beside NNCF and ModelOpt.

For each zoo model and each export form (tests/export_forms.py: initializers as exported, every
weight in a Constant node, MatMul/Gemm weights behind a Transpose, FP16 initializers behind Cast),
one run of the automatic flow (entropy calibration, INT8 repairs, ranking, search, verification)
and, right after it on the same file, one run of NNCF's ``quantize_with_accuracy_control``
(benchmarks/_nncf_peer.py, in the NNCF venv of benchmarks/setup_nncf.sh), each in its own process
(its own peak RSS, one ONNX Runtime thread), with the model's task metric and the same target:

* digits CNN, MobileNet-like digits classifier: top-1 accuracy on the held-out scenes;
* CRNN-like text recogniser: exact string match of 800 rendered strips;
* MiniLM-L6: retrieval MRR of the 351 first-sentence queries against their paragraphs;
* Silero VAD: frame ROC-AUC of the 32 speech-in-noise clips.

Recorded per run and tool: FP32, INT8 and final metric, the layers left out of INT8 (counted on each
tool's final model the same way: Conv/ConvTranspose/Gemm/MatMul nodes whose inputs are not both read
through DequantizeLinear), the task-metric evaluations (quantdbg: per phase; NNCF: calls of the
validation function on the full set, on the ranking subset, item by item), wall time, peak RSS, the
1-min load average when the run started; for quantdbg also where the time went (the evaluations,
the first calibration pass, the analysis, the rest). With ``QDBG_PEERS_PYTHON`` pointing at the
peers venv (benchmarks/setup_peers.sh), ModelOpt's INT8 (entropy, all defaults) is scored beside.

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
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))
import export_forms  # noqa: E402
from _bench import REPO, run_child  # noqa: E402
from _nncf_peer import UNCOUNTED, int8_layers  # noqa: E402
from _zoo_tasks import ZOO, bench_task, ctc_exact, mrr, run_command, silero_auc, write_section  # noqa: E402

import quantdbg  # noqa: E402
from quantdbg.evaluation import Accuracy, OutputFunction  # noqa: E402
from quantdbg.fallback import FallbackTarget  # noqa: E402
from quantdbg.pipeline import AutoConfig  # noqa: E402

FORMS = {"digits_cnn": ("initializers", "constants", "transposed", "fp16"),
         "mobilenet_digits": ("initializers", "constants"),
         "crnn_text": ("constants",),  # built with every weight in a Constant node
         "minilm_l6_v2_text": ("initializers", "constants"),
         "silero_vad_16k": ("initializers", "constants")}
MAX_REL_LOSS = 1.0
PEERS_PYTHON = os.environ.get("QDBG_PEERS_PYTHON", "/work/peers_venv/bin/python")
NNCF_PYTHON = os.environ.get("QDBG_NNCF_PYTHON", "/work/nncf_venv/bin/python")
MEM_GIB, TIMEOUT_S = 14.0, 4 * 3600


def task_metric(name: str, labels: np.ndarray | None) -> Any:
    """The model's task metric, scored in the analysis session.

    Each also scores a leading part of the evaluation set (the output-space ranking scores the
    first samples only): quantdbg's ``Accuracy`` cuts its labels itself (``TaskMetric.on_first``);
    MiniLM's pairs are interleaved (query, its paragraph, ...), and the labels of Silero's frames and
    of the text strips are cut to the rows scored.
    """
    if name in ("digits_cnn", "mobilenet_digits"):
        assert labels is not None
        return Accuracy(labels, output="logits")
    if name == "crnn_text":
        return OutputFunction(lambda out, ref: float(ctc_exact(out["logits"], labels[:len(out["logits"])])
                                                     .mean()), "exact match")
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


# ---- quantdbg's run (child process) -------------------------------------------------------------

class Clock:
    """Wall time inside the functions it wraps, per label, and how much of it was inside which other
    label (a recursive call of a label counts once)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.calls: dict[str, int] = {}
        self.inside: dict[tuple[str, str], float] = {}  # (outer, inner) -> seconds of inner within outer
        self._stack: list[str] = []

    def wrap(self, label: str, fn: Callable[..., Any], first_only: bool = False) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            if label in self._stack or (first_only and self.calls.get(label)):
                return fn(*args, **kwargs)
            self._stack.append(label)
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                spent = time.perf_counter() - start
                self._stack.pop()
                self.seconds[label] = self.seconds.get(label, 0.0) + spent
                self.calls[label] = self.calls.get(label, 0) + 1
                for outer in set(self._stack):
                    self.inside[outer, label] = self.inside.get((outer, label), 0.0) + spent
        return timed

    def own(self, label: str, less: tuple[str, ...]) -> float:
        """Seconds in ``label`` less those spent inside it in the ``less`` labels."""
        return self.seconds.get(label, 0.0) - sum(self.inside.get((label, inner), 0.0) for inner in less)


def _instrument(clock: Clock, metric: Any) -> None:
    """Times, without changing them, the parts of the flow the cost split needs: full passes of a
    model over the evaluation data and the task metric (the user's evaluations), the calibration
    passes, the analysis and the search."""
    from quantdbg.pipeline import context, flow
    from quantdbg.variants.evaluator import VariantEvaluator

    run_all = VariantEvaluator._run_all

    def passes(self: Any, model: Any, extra: Any, runner: Any = None, batches: int | None = None) -> Any:
        label = "eval passes" if batches is None else "head passes"
        return clock.wrap(label, run_all)(self, model, extra, runner, batches)

    VariantEvaluator._run_all = passes
    metric.from_outputs = clock.wrap("metric", metric.from_outputs)
    context.calibrate = clock.wrap("first calibration", context.calibrate, first_only=True)
    context.collect_stats = clock.wrap("histogram pass", context.collect_stats)
    context.AutoContext.analysis = clock.wrap("analysis", context.AutoContext.analysis)
    context.AutoContext.evidence = clock.wrap("analysis", context.AutoContext.evidence)  # the calibrator's
    context.AutoContext.output_sqnr = clock.wrap("gates", context.AutoContext.output_sqnr)
    context.AutoContext.bias_corrected = clock.wrap("bias pass", context.AutoContext.bias_corrected)
    flow.auto_fallback = clock.wrap("search", flow.auto_fallback)


EVALUATION = ("eval passes", "metric")  # a full pass of a model over the evaluation data; the metric


def _cost(clock: Clock, seconds: float) -> dict[str, float]:
    """quantdbg's wall time split: the evaluations (full passes + the metric), the first calibration
    pass, the analysis (the calibrator evidence and the fallback's ranking) and the search (each less
    the evaluations inside it), the repairs' gates and bias-correction pass, and the overhead:
    everything but the evaluations and the first calibration pass (the analysis is part of it)."""
    evals = sum(clock.seconds.get(label, 0.0) for label in EVALUATION)
    calib = clock.seconds.get("first calibration", 0.0)
    return {"wall_s": round(seconds, 2), "evaluations_s": round(evals, 2), "calibration_s": round(calib, 2),
            "analysis_s": round(clock.own("analysis", EVALUATION), 2),
            "search_s": round(clock.own("search", EVALUATION), 2),
            "histogram_pass_s": round(clock.seconds.get("histogram pass", 0.0), 2),
            "head_passes_s": round(clock.seconds.get("head passes", 0.0), 2),
            "gates_s": round(clock.seconds.get("gates", 0.0), 2),
            "bias_pass_s": round(clock.seconds.get("bias pass", 0.0), 2),
            "overhead_s": round(seconds - evals - calib, 2), "full_passes": clock.calls.get("eval passes", 0)}


def quantdbg_child(name: str, path: Path, max_rel_loss: float, work: Path) -> dict[str, Any]:
    """One automatic-flow run on one model file, timed; what the row records of quantdbg."""
    task = bench_task(name, work / "zoo")
    metric = task_metric(name, task.labels)
    clock = Clock()
    _instrument(clock, metric)
    target = FallbackTarget.max_relative_loss(max_rel_loss)
    start = time.perf_counter()
    result = quantdbg.auto(str(path), task.calib, task.eval, target, metric=metric,
                           config=AutoConfig(threads=1))
    seconds = time.perf_counter() - start
    plan = result.plan
    excluded = list(result.model.excluded) if result.model is not None else []
    return {"outcome": result.outcome, "message": result.message, "fp32": result.fp32_value,
            "int8": result.int8_value, "repaired": result.repaired_value, "final": result.final_value,
            "n_layers": result.n_layers, "excluded": excluded,
            "share": len(excluded) / result.n_layers if result.n_layers else 0.0,
            "evaluations": dict(result.evaluations), "n_evaluations": sum(result.evaluations.values()),
            "repairs": [r.to_dict() for r in result.recipe.repairs] if result.recipe is not None else [],
            "strategy": None if plan is None else plan.strategy, "cost": _cost(clock, seconds),
            "final_layers": int8_layers(result.model.model) if result.model is not None else {}}


# ---- the peers ----------------------------------------------------------------------------------

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
    return float(task_metric(name, task.labels).from_outputs(outputs, outputs))


def nncf_summary(found: dict[str, Any]) -> dict[str, Any]:
    """NNCF's run in the row's terms: baselines, validations by kind, layers out of INT8."""
    calls, n = found["calls"], found["n_items"]
    counted = [c for c in calls if c["phase"] not in UNCOUNTED]
    baseline = [c["metric"] for c in counted if c["phase"] == "baseline"]
    full = [c for c in counted if c["items"] == n and c["phase"] != "rank"]
    items = sum(c["items"] for c in counted)
    final = found["final_layers"]
    return {"fp32": baseline[0] if baseline else None, "int8": baseline[1] if len(baseline) > 1 else None,
            "final": found["final"], "n_layers": len(final),
            "excluded": sorted(k for k, v in final.items() if not v),
            "int8_excluded": sorted(k for k, v in found["int8_layers"].items() if not v),
            "reverted_ops": sum(len(g["operations"]) for g in found["reverted_groups"]),
            "reverted_groups": found["reverted_groups"], "quantized_ops": found["nncf_quantized_ops"],
            "full_validations": len(full), "rank_validations": sum(c["phase"] == "rank" for c in counted),
            "item_validations": sum(c["phase"] == "per-item" for c in counted),
            "item_equivalents": round(items / n, 2),
            "validation_s": round(sum(c["seconds"] for c in counted), 2), "quantize_s": found["quantize_s"],
            "wall_s": found["wall_s"], "calls": calls, "int8_trt": found.get("int8_trt"),
            "final_trt": found.get("final_trt"), "uint8_quantizers": found.get("uint8_quantizers")}


def library_commit() -> str:
    """The last commit that changed the library (src/): what a row measured, whatever the harness."""
    done = subprocess.run(["git", "-C", str(REPO), "log", "-1", "--format=%h", "--", "src"],
                          capture_output=True, text=True)
    return done.stdout.strip() or "unknown"


def _measured(child: Any) -> dict[str, Any]:
    return {"status": child.status, "error": child.error, "peak_rss_mib": child.peak_rss_mib,
            "cpu_s": child.cpu_s, "process_s": child.wall_s, "load1": round(child.load_before, 2)}


def run(name: str, form: str, work: Path, max_rel_loss: float = MAX_REL_LOSS) -> dict[str, Any]:
    """One row: quantdbg, then NNCF, on the same form of one zoo model (each in its own process)."""
    task = bench_task(name, work / "zoo")
    path = work / f"{name}_{form}.onnx"
    onnx.save(export_forms.form(onnx.load(str(task.model)), form), str(path))
    args = [str(path), str(max_rel_loss), str(work)]
    logs = work / "logs"
    ours = run_child(Path(sys.executable), [str(HERE / "auto.py"), "--child", name, *args],
                     logs / f"{name}_{form}_q.log", MEM_GIB, TIMEOUT_S)
    row = {"model": name, "form": form, "max_rel_loss": max_rel_loss, "commit": library_commit(),
           **ours.result, **_measured(ours)}
    row.pop("ok", None)
    if Path(NNCF_PYTHON).is_file():
        peer = run_child(Path(NNCF_PYTHON), [str(HERE / "_nncf_peer.py"), name, *args],
                         logs / f"{name}_{form}_n.log", MEM_GIB, TIMEOUT_S)
        row["nncf"] = {**(nncf_summary(peer.result) if peer.status == "ok" else {}), **_measured(peer)}
    row["modelopt_int8"] = modelopt_metric(name, path, work)
    shown = ("model", "form", "fp32", "int8", "final", "share", "n_evaluations")
    print(json.dumps({k: row.get(k) for k in shown}), json.dumps({k: row.get("nncf", {}).get(k) for k in (
        "status", "int8", "final", "int8_trt", "final_trt", "excluded", "full_validations")}),
          file=sys.stderr, flush=True)
    return row


# ---- the section --------------------------------------------------------------------------------

def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4f}"


def _secs(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.0f} s"


def _ratio(a: float | None, b: float | None) -> str:
    return "n/a" if not a or not b else f"{a / b:.2f}"


def _quantizers(types: dict[str, Any]) -> str:
    """'5 of 12 UINT8': a model's QuantizeLinear nodes that are not INT8, of all; the INT8 ones with a
    nonzero zero point (asymmetric: TensorRT does not build them either) counted apart."""
    other = [t for t in types["by_type"] if t != "INT8"]
    asymmetric = types.get("rewritten", types["non_int8"]) - types["non_int8"]
    shifted = f"{asymmetric} of {types['total']} INT8 with a nonzero zero point"
    if types["non_int8"] == 0 and asymmetric > 0:
        return shifted
    text = f"{types['non_int8']} of {types['total']} {'/'.join(other) or 'not INT8'}"
    return f"{text}, {shifted}" if asymmetric > 0 else text


def _trt_cell(n: dict[str, Any]) -> str:
    """NNCF's INT8 and final metric in TensorRT's INT8 form, and the final model's quantizers not INT8
    (n/a in rows recorded before these were measured)."""
    types = n.get("uint8_quantizers")
    if types is None:
        return "n/a"
    count = _quantizers(types["final"])
    if types["int8"]["non_int8"] != types["final"]["non_int8"]:  # reverted quantizers
        count += f"; INT8 model {types['int8']['non_int8']}"
    return f"{_fmt(n.get('int8_trt'))} / {_fmt(n.get('final_trt'))} ({count})"


def _row_cells(r: dict[str, Any]) -> str:
    n = r.get("nncf", {})
    form = r["form"] if r["max_rel_loss"] == MAX_REL_LOSS else f"{r['form']}, {r['max_rel_loss']:g} %"
    if r["status"] != "ok":
        return f"| {r['model']} | {form} | quantdbg {r['status']}: {r['error'][:200]} |"
    q_out = str(sum(not v for v in r.get("final_layers", {}).values()))
    if len(r["excluded"]) != int(q_out):  # quantdbg's own layers count quantized Adds too
        q_out += f" [{len(r['excluded'])} of its {r['n_layers']}]"
    ok = n.get("status") == "ok"
    n_out = f"{len(n['excluded'])} ({n['reverted_ops']} ops)" if ok else n.get("status", "n/a")
    n_evals = (f"{n['full_validations']} + {n['rank_validations']} rank + {n['item_validations']} item"
               if ok else "n/a")
    subset = r["evaluations"].get("rank", 0)  # the output-space ranking scores the first 64 samples
    q_evals = f"{r['n_evaluations'] - subset} + {subset} subset (" + ", ".join(
        f"{k} {v}" for k, v in r["evaluations"].items() if v and k != "rank") + ")"
    cost = r["cost"]
    wall = cost["wall_s"]
    split = " / ".join(f"{100 * cost.get(k, 0.0) / wall:.0f}"
                       for k in ("evaluations_s", "analysis_s", "gates_s", "bias_pass_s", "overhead_s"))
    return (f"| {r['model']} | {form} | {_fmt(r['fp32'])} | {_fmt(r.get('modelopt_int8'))} | "
            f"{_fmt(r['int8'])} / {_fmt(n.get('int8'))} | {_fmt(r['final'])} / {_fmt(n.get('final'))} | "
            f"{_trt_cell(n)} | {q_out} / {n_out} of {len(r.get('final_layers', {}))} | "
            f"{q_evals} / {n_evals} | "
            f"{wall:.0f} / {_secs(n.get('wall_s'))} ({_ratio(wall, n.get('wall_s'))}) | "
            f"{r['peak_rss_mib']:.0f} / {n.get('peak_rss_mib', 0):.0f} MiB | {split} % | {r['load1']:.1f} |")


def section(rows: list[dict[str, Any]], command: str, commit: str, notes: str) -> str:
    """The RESULTS.md section (``notes``: the hand-written reading, kept between runs)."""
    from _bench import machine

    m = machine()
    lines = ["## The automatic flow on real export forms (`quantdbg auto`), beside NNCF", "",
             f"Command: `{command}` (library: commit {commit}, the last to change src/). Machine: "
             f"{m['cpu']}, {m['cores']} cores, "
             f"{m['mem_gib']} GiB, shared with other jobs (load average per row).", "",
             "Each cell is *quantdbg / NNCF 3.4* (`nncf.quantize_with_accuracy_control`, ONNX backend, "
             "benchmarks/_nncf_peer.py), measured one after the other in one invocation on the same file. "
             "Target: task metric within the row's relative loss of FP32 (1 % unless the form says "
             "otherwise). Out of INT8: Conv/ConvTranspose/Gemm/MatMul nodes of the tool's final model whose "
             "inputs are not both read through DequantizeLinear, of all such nodes; NNCF's reverted "
             "operations (every op of its reverted quantizer groups) in brackets. Evaluations: quantdbg's "
             "full task-metric evaluations + those on the first 64 samples (the output-space ranking), per "
             "phase / NNCF's validation-function calls on the full set + on its ranking subset + on single "
             "items. NNCF in TensorRT's INT8: NNCF's INT8 / final model scored with each Q/DQ pair that is "
             "not INT8 with zero point 0 (NNCF quantizes ReLU outputs to UINT8, which TensorRT does not "
             "build) made INT8 with zero point 0 over the same clipping range (half the levels), and how "
             "many QuantizeLinear nodes of its final model are not INT8 (its weights are stored in INT8, "
             "without QuantizeLinear). Time: around the API call "
             "(ratio quantdbg/NNCF); RSS: the process's peak. Cost split (quantdbg): evaluations (full "
             "passes over the evaluation data + the metric) / analysis / gates / bias pass / overhead "
             "(everything but the "
             "evaluations and the first calibration pass; the analysis, the repairs' output-SQNR gates and "
             "the bias-correction pass are part of it).", "",
             "| model | form | FP32 | ModelOpt INT8 | INT8 | final | "
             "NNCF in TensorRT's INT8 (INT8 / final) | out of INT8 | evaluations | time | peak RSS | "
             "eval / analysis / gates / bias pass / overhead | load |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    lines += [_row_cells(r) for r in rows]
    lines += ["", notes.strip(), "", "Layers kept out of INT8, per run (quantdbg; NNCF):", ""]
    for r in (r for r in rows if r["status"] == "ok"):
        n = r.get("nncf", {})
        started = any(rep.get("at_start") for rep in r["repairs"])
        kept = [_kept(rep, started) for rep in r["repairs"] if rep.get("kept")]
        target = "" if r["max_rel_loss"] == MAX_REL_LOSS else f" ({r['max_rel_loss']:g} %)"
        failed = "" if n.get("status") == "ok" else f" ({n.get('status')}: {n.get('error')})"
        lines.append(f"- {r['model']} / {r['form']}{target}: quantdbg {', '.join(r['excluded']) or 'none'} "
                     f"(repairs kept: {', '.join(kept) or 'none'}); NNCF "
                     f"{', '.join(n.get('excluded', [])) or 'none'}{failed}.")
    return "\n".join(lines)


def _kept(repair: dict[str, Any], started: bool) -> str:
    """A kept repair's name; the calibrator choice made the INT8 start (``started``), or the default
    calibration the calibrator repair gives back when that start missed the target, said so."""
    if repair["repair"] != "calibrator" or not started:
        return str(repair["repair"])
    return "calibrator (the INT8 start)" if repair.get("at_start") else "calibrator (the default back)"


def _recorded(path: Path | None) -> list[dict[str, Any]]:
    if path is None or not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


NOTES_START, NOTES_END = "<!-- auto-notes:start -->", "<!-- auto-notes:end -->"


def _notes() -> str:
    """The hand-written reading of the previous section, between its notes markers (kept)."""
    from _zoo_tasks import RESULTS

    text = RESULTS.read_text() if RESULTS.exists() else ""
    if NOTES_START in text and NOTES_END in text:
        return NOTES_START + text.split(NOTES_START, 1)[1].split(NOTES_END, 1)[0] + NOTES_END
    return f"{NOTES_START}\n(reading to be written)\n{NOTES_END}"


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
    parser.add_argument("--child", nargs=4, metavar=("NAME", "MODEL", "MAX_REL_LOSS", "WORK"),
                        help=argparse.SUPPRESS)
    parser.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        name, model, loss, work = args.child
        found = quantdbg_child(name, Path(model), float(loss), Path(work))
        args.result.write_text(json.dumps({"ok": True, **found}))
        return 0
    rows = _recorded(args.rows)
    done = {(r["model"], r["form"], r["max_rel_loss"]) for r in rows}
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
                  key=lambda r: (order[r["model"], r["form"]], -r["max_rel_loss"]))
    commits = sorted({r.get("commit", "") for r in rows} - {""})
    command = run_command("auto.py", Path(tempfile.gettempdir()), report_only=False)
    text = section(rows, command, ", ".join(commits) or "unknown", _notes())
    if args.no_write:
        print(text)
        return 0
    args.json.write_text(json.dumps(rows, indent=1, sort_keys=True) + "\n")
    write_section("auto", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
