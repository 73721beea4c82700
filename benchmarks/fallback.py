"""The automatic FP16 fallback flow on the zoo models, with every written model re-scored independently.

For each model: quantize, rank the layers (``local`` by default; ``isolated`` / ``leave-one-out``
rankings are reused from ``benchmarks/sensitivity.py``'s work folder when present), run
:func:`quantdbg.fallback.auto_fallback` (gallop + bisection + greedy pruning; the budget is
``2*log2(L)+2`` full evaluations plus one verification on the real FP16 model), write the mixed
model, and re-score it with the model builder's own ``--eval`` (../shared/models) in a separate
process. The baseline of the issue, top-k of the isolated ranking, is run too (``linear``).

    python benchmarks/fallback.py                          # all models, RESULTS.md section
    python benchmarks/fallback.py --models minilm_l6_v2_text --rankings local isolated
"""
from __future__ import annotations

import argparse
import ast
import json
import logging
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _zoo_tasks import ZOO, load_task, minilm_gate, run_command, silero_f1, write_section  # noqa: E402
from sensitivity import ONE_THREAD, SETTINGS, quantized  # noqa: E402

from quantdbg.calibration import SmoothingConfig, smooth  # noqa: E402
from quantdbg.config import CalibConfig, Precision  # noqa: E402
from quantdbg.evaluation import Accuracy, OutputFunction  # noqa: E402
from quantdbg.fallback import FallbackConfig, FallbackTarget, auto_fallback  # noqa: E402
from quantdbg.model import load_model, save_model  # noqa: E402
from quantdbg.qdq import (  # noqa: E402
    QuantizedModel,  # noqa: E402
    quantize,  # noqa: E402
    records_from_model,  # noqa: E402
)
from quantdbg.sensitivity import (  # noqa: E402
    SensitivityConfig,
    SensitivityReport,
    VariantEvaluator,
    analyze_sensitivity,
    suggest_calibrators,
)
from quantdbg.sensitivity.analyze import finished_report  # noqa: E402

BUILDERS = Path("/work/shared/models")
MODELS = ("minilm_l6_v2_text", "digits_cnn", "silero_vad_16k")


def targets(name: str, labels: np.ndarray | None) -> list[tuple[str, object, FallbackTarget]]:
    """(label, task metric, target) of every flow run on a model."""
    if name == "minilm_l6_v2_text":
        # >= 0 exactly when embedding cosine >= 0.99 AND recall@1 >= 0.330 (the target).
        gate = OutputFunction(minilm_gate, "min(cos-0.99, (R@1-0.330)/10)")
        return [("cos >= 0.99 and R@1 >= .330", gate, FallbackTarget.min_metric(0.0))]
    if name == "digits_cnn":
        return [("no top-1 loss vs FP32", Accuracy(labels), FallbackTarget.max_relative_loss(0.0)),
                ("logit SQNR >= 45 dB", "sqnr", FallbackTarget.min_sqnr(45.0))]
    f1 = OutputFunction(lambda out, ref: silero_f1({"p": out["speech_probs"]}, labels), "f1_at_0.5")
    return [("F1@0.5 within 0.1 % of FP32", f1, FallbackTarget.max_relative_loss(0.1))]


def builder_eval(name: str, model: Path) -> dict:
    """The model builder's own score of ``model`` (separate process)."""
    builder = {"minilm_l6_v2_text": "minilm_l6_v2_text.py", "digits_cnn": "digits_cnn_train.py",
               "silero_vad_16k": "silero_vad_speech.py"}[name]
    done = subprocess.run([sys.executable, str(BUILDERS / builder), "--eval", str(model)],
                          capture_output=True, text=True, check=True)
    last = done.stdout.strip().splitlines()[-1]
    return ast.literal_eval(last.replace("np.float64(", "(").replace("nan", "None"))


def ranking(key: str, mode: str, fp_model, task, qmodel, work: Path) -> SensitivityReport:
    """A ranking: reused from the sensitivity benchmark's work folder when it finished there."""
    for candidate in (work / f"{key}_{mode}.json", work / f"{key}_{mode}_evidence.json"):
        found = finished_report(candidate)
        if found is not None:
            return found
    metric = targets(task.name, task.labels)[0][1] if mode in ("isolated", "leave-one-out") else "sqnr"
    config = SensitivityConfig(mode=mode, evidence=mode == "local",
                               results_path=work / f"{key}_{mode}_evidence.json")
    return analyze_sensitivity(fp_model, qmodel, task.eval, config, metric=metric, runner_factory=ONE_THREAD)


def int8_variant(task, work: Path, quantizer: str):
    """(FP32 model, Q/DQ model) of one INT8 recipe, cached in ``work``.

    ``quantdbg``: the benchmark's settings; ``calibrators``: the same, with the calibrator of each
    activation tensor chosen from the local ranking's evidence (``suggest_calibrators``);
    ``smoothquant``: SmoothQuant-style migration (alpha 0.5) of the MatMul inputs first;
    ``modelopt``: the ModelOpt-quantized model of the zoo, read with ``records_from_model``.
    """
    calib, quant, _ = SETTINGS[task.name]
    if quantizer == "quantdbg":
        return task.model, quantized(task, work)
    if quantizer == "modelopt":
        return task.model, records_from_model(ZOO / task.name / "modelopt_int8.onnx")
    path = work / f"{task.name}_{quantizer}_int8.onnx"
    fp_path = work / f"{task.name}_{quantizer}_fp32.onnx" if quantizer == "smoothquant" else task.model
    if quantizer == "smoothquant" and not fp_path.exists():
        ops = ("MatMul",) if quant.op_types == ("MatMul",) else ("MatMul", "Gemm")
        save_model(smooth(task.model, task.calib, SmoothingConfig(alpha=0.5, op_types=ops)).model, fp_path)
    records = path.with_suffix(".records.json")
    if path.exists() and records.exists():
        return fp_path, QuantizedModel.from_dict(json.loads(records.read_text()),
                                                 load_model(path, allow_quantized=True))
    if quantizer == "calibrators":
        evidence = work / f"{task.name}_local_evidence.json"
        report = analyze_sensitivity(task.model, quantized(task, work), task.eval,
                                     SensitivityConfig(results_path=evidence), runner_factory=ONE_THREAD)
        calib = CalibConfig(method=calib.method, per_tensor=suggest_calibrators(report))
        logging.info("%s: calibrators from the evidence: %s", task.name, dict(calib.per_tensor))
    qmodel = quantize(fp_path, task.calib, calib, quant)
    qmodel.save(path)
    records.write_text(json.dumps(qmodel.to_dict()))
    return fp_path, qmodel


def run_flow(name: str, mode: str, strategy: str, work: Path, which: int = 0,
             quantizer: str = "quantdbg") -> dict:
    """One automatic flow; returns its numbers (search and independent re-score)."""
    task = load_task(name, work)
    fp_model, qmodel = int8_variant(task, work, quantizer)
    label, metric, target = targets(name, task.labels)[which]
    start = time.perf_counter()
    report = ranking(name if quantizer == "quantdbg" else f"{name}_{quantizer}", mode, fp_model, task, qmodel,
                     work)
    rank_s = time.perf_counter() - start
    start = time.perf_counter()
    budget = None if strategy == "bisect" else len(qmodel.layers)
    config = FallbackConfig(SensitivityConfig(mode=mode), strategy=strategy, precision=Precision.FP16,
                            max_evaluations=budget)
    with VariantEvaluator(fp_model, qmodel, task.eval, metric, ONE_THREAD) as evaluator:
        result = auto_fallback(evaluator, target, config, report=report)
    search_s = time.perf_counter() - start
    plan = result.plan
    row = {"model": name, "quantizer": quantizer, "target": label, "ranking": mode, "strategy": strategy,
           "status": plan.status, "layers": len(qmodel.layers), "exclude": list(plan.exclude),
           "n_fp16": len(plan.exclude), "evaluations": plan.n_evaluations, "budget": plan.budget,
           "verified_value": plan.value, "rank_s": round(rank_s, 1), "search_s": round(search_s, 1),
           "curve": [(len(e.exclude), e.value, e.purpose) for e in plan.evaluations]}
    if result.mixed is not None:
        path = work / f"{name}_{quantizer}_{mode}_{strategy}_{which}_mixed.onnx"
        result.mixed.save(path)
        plan.with_build(path, task.eval).write(path.with_suffix(".plan.json"))
        row["builder_eval"] = builder_eval(name, path)
    logging.info("%s", json.dumps({k: v for k, v in row.items() if k != "curve"}))
    return row


def int8_rows(names: list[str], work: Path) -> list[dict]:
    """FP32 and all-INT8 scores from the builders, for the table."""
    rows = []
    for name in names:
        task = load_task(name, work)
        quantized(task, work)
        rows.append({"model": name, "fp32": json.loads((ZOO / name / "metrics_fp32.json").read_text()),
                     "int8": builder_eval(name, work / f"{name}_int8.onnx")})
    return rows


def _fmt_eval(name: str, scores: dict) -> str:
    keys = {"minilm_l6_v2_text": (("emb_cosine_vs_fp32_mean", "cos"), ("recall_at_1", "R@1")),
            "digits_cnn": (("top1", "top-1"), ("top1_agree_fp32", "agree")),
            "silero_vad_16k": (("roc_auc", "AUC"), ("f1_at_0.5", "F1"))}[name]
    return ", ".join(f"{label} {scores[key]:.4f}" for key, label in keys if key in scores)


def markdown(rows: list[dict], ints: list[dict], command: str) -> str:
    """The RESULTS.md section."""
    lines = ["## FP16 fallback search (automatic flow)", "",
             f"Command: `{command}`. One ONNX Runtime thread. Every mixed model is written with the "
             "layers kept out of INT8 in FP16 and re-scored by the model builder's own `--eval` in a "
             "separate process (../shared/models); search evaluations run in one session of the "
             "switchable graph, the verification on the real FP16 model. Budget: floor(2*log2(L)+2) full "
             "evaluations + 1 verification.", "",
             "| model | FP32 | all INT8 (quantdbg) |", "|---|---|---|"]
    for r in ints:
        lines.append(f"| {r['model']} | {_fmt_eval(r['model'], r['fp32'])} | "
                     f"{_fmt_eval(r['model'], r['int8'])} |")
    lines += ["", "| model | quantizer | target | ranking | strategy | status | FP16 layers / L | "
              "evaluations / budget | re-scored mixed model | search s |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        scored = _fmt_eval(r["model"], r["builder_eval"]) if "builder_eval" in r else "-"
        lines.append(f"| {r['model']} | {r['quantizer']} | {r['target']} | {r['ranking']} | "
                     f"{r['strategy']} | {r['status']} | {r['n_fp16']} / {r['layers']} | "
                     f"{r['evaluations']} / {r['budget']} + 1 | {scored} | {r['search_s']} |")
    lines += ["", "Layers kept in FP16:", ""]
    for r in rows:
        exclude = ", ".join(f"`{n}`" for n in r["exclude"]) or "none"
        lines.append(f"- {r['model']} ({r['quantizer']}, {r['target']}, {r['ranking']}, {r['strategy']}): "
                     f"{exclude}")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    parser.add_argument("--rankings", nargs="+", default=["local"], help="Ranking modes to search with.")
    parser.add_argument("--baseline", action="store_true",
                        help="Also top-k (linear) over the isolated ranking.")
    parser.add_argument("--quantizers", nargs="+", default=["quantdbg"],
                        choices=("quantdbg", "calibrators", "smoothquant", "modelopt"),
                        help="INT8 recipes to start from (modelopt: MiniLM's ModelOpt model from the zoo).")
    parser.add_argument("--work", type=Path, default=Path("/tmp/qdbg_sensitivity"))
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument("--report-only", action="store_true", help="Rewrite RESULTS.md from saved rows.")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    args.work.mkdir(parents=True, exist_ok=True)
    out = args.work / "fallback_rows.json"
    rows: list[dict] = []
    if not args.report_only:
        for name in args.models:
            for quantizer in args.quantizers:
                if quantizer == "modelopt" and not (ZOO / name / "modelopt_int8.onnx").exists():
                    logging.warning("%s: no modelopt_int8.onnx in the zoo; skipped", name)
                    continue
                for which in range(len(targets(name, np.zeros(1, np.int64)))):
                    for mode in args.rankings:
                        rows.append(run_flow(name, mode, "bisect", args.work, which, quantizer))
                    if args.baseline and quantizer == "quantdbg":
                        rows.append(run_flow(name, "isolated", "linear", args.work, which, quantizer))
    key = lambda r: (r["model"], r["quantizer"], r["target"], r["ranking"], r["strategy"])  # noqa: E731
    old = json.loads(out.read_text()) if out.exists() else []
    rows = [r for r in old if key(r) not in {key(n) for n in rows}] + rows
    out.write_text(json.dumps(rows, indent=2, default=float))
    print(json.dumps(rows, indent=2, default=float))
    command = run_command("fallback.py", args.work, args.report_only)
    if not args.no_write:
        names = list(dict.fromkeys(r["model"] for r in rows))
        write_section("quantdbg:fallback", markdown(rows, int8_rows(names, args.work), command))


if __name__ == "__main__":
    main()
