"""Cost and rank fidelity of the four sensitivity modes on the zoo models.

For each model: quantize it (settings below), time one FP32 ONNX Runtime pass over the eval set,
then time every mode over the same eval set (one ORT thread throughout, so the ratios do not
depend on who else uses the machine's other core), and compare the ``local`` ranking with the
``isolated`` one (Spearman correlation of their scores, both top-5 lists). Reports are kept in
``--work`` so an interrupted run resumes where it stopped (isolated / leave-one-out sweeps resume
variant by variant) and ``benchmarks/fallback.py`` can reuse the rankings.

    python benchmarks/sensitivity.py                       # all models, all modes, RESULTS.md
    python benchmarks/sensitivity.py --models digits_cnn --no-write
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _zoo_tasks import ZooTask, load_task, minilm_cosine, run_command, write_section  # noqa: E402

from quantdbg.backends import OnnxrtRunnerFactory, OrtConfig  # noqa: E402
from quantdbg.config import CalibConfig, QuantConfig  # noqa: E402
from quantdbg.evaluation import OutputFunction  # noqa: E402
from quantdbg.model import load_model  # noqa: E402
from quantdbg.qdq import (  # noqa: E402
    QuantizedModel,  # noqa: E402
    quantize,  # noqa: E402
)
from quantdbg.sensitivity import SensitivityConfig, SensitivityReport, VariantEvaluator, analyze_sensitivity  # noqa: E402
from quantdbg.sensitivity.analyze import finished_report  # noqa: E402
from quantdbg.sensitivity.config import MODES  # noqa: E402

MODELS = ("digits_cnn", "minilm_l6_v2_text", "silero_vad_16k")
SETTINGS = {  # model -> (calibration, placement, what isolated / leave-one-out rank by)
    "digits_cnn": (CalibConfig(method="entropy"), QuantConfig(), "sqnr"),
    "minilm_l6_v2_text": (CalibConfig(method="minmax"), QuantConfig(op_types=("MatMul",)),
                          OutputFunction(minilm_cosine, "embedding_cosine")),
    "silero_vad_16k": (CalibConfig(method="entropy"), QuantConfig(), "sqnr"),
}
ONE_THREAD = OnnxrtRunnerFactory(OrtConfig(intra_op_num_threads=1))


def quantized(task: ZooTask, work: Path) -> QuantizedModel:
    """The INT8 model of a task, cached in ``work`` (model + records)."""
    calib, quant, _ = SETTINGS[task.name]
    path, records = work / f"{task.name}_int8.onnx", work / f"{task.name}_int8.records.json"
    if path.exists() and records.exists():
        model = load_model(path, allow_quantized=True)
        return QuantizedModel.from_dict(json.loads(records.read_text()), model)
    qmodel = quantize(task.model, task.calib, calib, quant)
    qmodel.save(path)
    records.write_text(json.dumps(qmodel.to_dict()))
    return qmodel


def fp32_pass_seconds(task: ZooTask, qmodel: QuantizedModel, repeats: int = 2) -> float:
    """Fastest of ``repeats`` FP32 passes over the eval set (same runner settings as the modes)."""
    best = float("inf")
    for _ in range(repeats):
        evaluator = VariantEvaluator(task.model, qmodel, task.eval, "sqnr", ONE_THREAD)
        start = time.perf_counter()
        evaluator.reference()
        best = min(best, time.perf_counter() - start)
    return best


def run_mode(task: ZooTask, qmodel: QuantizedModel, mode: str, work: Path,
             evidence: bool) -> tuple[SensitivityReport, bool]:
    """Runs (or resumes, or reloads) one mode; returns its report and whether it was resumed.

    ``report.seconds`` is the wall time of the call that finished the analysis (for a resumed
    sweep, only its own part), so timings are only quoted for uninterrupted runs.
    """
    metric = SETTINGS[task.name][2] if mode in ("isolated", "leave-one-out") else "sqnr"
    path = work / f"{task.name}_{mode}{'_evidence' if evidence else ''}.json"
    resumed = path.exists() and finished_report(path) is None
    config = SensitivityConfig(mode=mode, evidence=evidence, results_path=path)
    report = analyze_sensitivity(task.model, qmodel, task.eval, config, metric=metric,
                                 runner_factory=ONE_THREAD)
    return report, resumed


def bracketed(task: ZooTask, qmodel: QuantizedModel, mode: str) -> dict:
    """Times ``mode`` between two FP32 passes (fresh run, no results file), so its ratio to the FP32
    pass is measured under the same machine load."""
    metric = SETTINGS[task.name][2] if mode in ("isolated", "leave-one-out") else "sqnr"
    before = fp32_pass_seconds(task, qmodel, repeats=1)
    start = time.perf_counter()
    analyze_sensitivity(task.model, qmodel, task.eval, SensitivityConfig(mode=mode, evidence=False),
                        metric=metric, runner_factory=ONE_THREAD)
    seconds = time.perf_counter() - start
    after = fp32_pass_seconds(task, qmodel, repeats=1)
    return {"seconds": round(seconds, 1), "fp32_s": round((before + after) / 2, 2),
            "x_fp32": round(2 * seconds / (before + after), 2)}


def spearman(a: SensitivityReport, b: SensitivityReport) -> float:
    """Spearman correlation of two reports' scores over the same layers."""
    from scipy.stats import spearmanr

    layers = sorted(a.ranking)
    return float(spearmanr([a.layer(n).score for n in layers], [b.layer(n).score for n in layers]).statistic)


def benchmark(name: str, work: Path, modes: list[str]) -> dict:
    """Every measurement for one model."""
    task = load_task(name, work)
    qmodel = quantized(task, work)
    cached = work / f"{name}_fp32_pass_seconds.txt"  # measured with the modes, reused on reruns
    if cached.exists():
        base = float(cached.read_text())
    else:
        base = fp32_pass_seconds(task, qmodel)
        cached.write_text(f"{base}\n")
    logging.info("%s: FP32 pass %.1f s, %d layers", name, base, len(qmodel.layers))
    row: dict = {"model": name, "layers": len(qmodel.layers), "fp32_pass_s": round(base, 2), "modes": {}}
    reports = {}
    for mode in modes:
        report, resumed = run_mode(task, qmodel, mode, work, evidence=False)
        reports[mode] = report
        row["modes"][mode] = {"seconds": round(report.seconds, 1), "x_fp32": round(report.seconds / base, 2),
                              "passes": report.n_passes, "resumed": resumed, "top5": list(report.top(5))}
        logging.info("%s %s: %.1f s = %.2fx FP32", name, mode, report.seconds, report.seconds / base)
    for mode in modes:  # the one-pass modes are timed again between two FP32 passes; sweeps once
        if mode in ("local", "cumulative") or base < 5:
            row["modes"][mode]["bracketed"] = bracketed(task, qmodel, mode)
    if "local" in modes:
        report, _ = run_mode(task, qmodel, "local", work, evidence=True)
        row["local_with_evidence_x_fp32"] = round(report.seconds / base, 2)
    if "local" in reports and "isolated" in reports:
        row["spearman_local_isolated"] = round(spearman(reports["local"], reports["isolated"]), 3)
    if "leave-one-out" in reports and "isolated" in reports:
        row["spearman_loo_isolated"] = round(spearman(reports["leave-one-out"], reports["isolated"]), 3)
    if "cumulative" in reports and "isolated" in reports:
        row["spearman_cumulative_isolated"] = round(spearman(reports["cumulative"], reports["isolated"]), 3)
    row["load_average"] = round(os.getloadavg()[0], 1)
    return row


def _cell(mode: dict) -> str:
    if "bracketed" in mode:
        b = mode["bracketed"]
        return f"{b['x_fp32']}x ({b['seconds']} s vs {b['fp32_s']} s)"
    return f"{mode['x_fp32']}x ({mode['seconds']} s; {mode['passes']} passes)*"


def markdown(rows: list[dict], command: str) -> str:
    """The RESULTS.md section."""
    modes = [m for m in MODES if any(m in r["modes"] for r in rows)]
    lines = ["## Sensitivity analysis: cost of each mode and rank fidelity", "",
             f"Command: `{command}` ({platform.machine()}, {platform.python_version()}, one ONNX Runtime "
             "thread, evidence off unless stated). Time of each mode as a multiple of one FP32 ONNX Runtime "
             "pass over the same eval set (target for `local`: <= 3x). The machine (2 cores) was shared "
             "with other jobs; 1-minute load average at the end of each model's run: "
             + ", ".join(f"{r['model']} {r.get('load_average', '?')}" for r in rows) + ".", "",
             "Each cell: mode time / FP32 pass time (mode seconds vs the mean of one FP32 pass just "
             "before and just after it). `*`: a long sweep timed once, against the FP32 pass measured "
             "when the model's run started.", "",
             "| model | layers | FP32 pass (s) | " + " | ".join(modes) + " | local + evidence |",
             "|---|---|---|" + "---|" * len(modes) + "---|"]
    for r in rows:
        cells = [_cell(r["modes"][m]) if m in r["modes"] else "-" for m in modes]
        lines.append(f"| {r['model']} | {r['layers']} | {r['fp32_pass_s']} | " + " | ".join(cells)
                     + f" | {r.get('local_with_evidence_x_fp32', '-')}x |")
    lines += ["", "Rank fidelity (Spearman correlation of the per-layer scores, scipy.stats.spearmanr):", ""]
    for r in rows:
        if "spearman_local_isolated" not in r:
            continue
        lines += [f"- **{r['model']}**: local vs isolated rho = {r['spearman_local_isolated']}"
                  + (f"; leave-one-out vs isolated rho = {r['spearman_loo_isolated']}"
                     if "spearman_loo_isolated" in r else "")
                  + (f"; cumulative vs isolated rho = {r['spearman_cumulative_isolated']}"
                     if "spearman_cumulative_isolated" in r else ""),
                  f"  - local top-5: {', '.join(f'`{n}`' for n in r['modes']['local']['top5'])}",
                  f"  - isolated top-5: {', '.join(f'`{n}`' for n in r['modes']['isolated']['top5'])}",
                  f"  - in both top-5 lists: {_overlap(r, 'local', 'isolated')} of 5"]
    return "\n".join(lines) + "\n"


def _overlap(row: dict, a: str, b: str) -> int:
    return len(set(row["modes"][a]["top5"]) & set(row["modes"][b]["top5"]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    parser.add_argument("--work", type=Path, default=Path("/tmp/qdbg_sensitivity"))
    parser.add_argument("--no-write", action="store_true", help="Do not touch RESULTS.md.")
    parser.add_argument("--report-only", action="store_true", help="Rewrite RESULTS.md from saved rows.")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    args.work.mkdir(parents=True, exist_ok=True)
    saved = args.work / "sensitivity_rows.json"  # rows of models not run this time are kept
    command = run_command("sensitivity.py", args.work, args.report_only)
    if args.report_only:
        write_section("quantdbg:sensitivity", markdown(json.loads(saved.read_text()), command))
        return
    rows = [benchmark(name, args.work, args.modes) for name in args.models]
    old = json.loads(saved.read_text()) if saved.exists() else []
    old = [r for r in old if r["model"] not in args.models]
    rows = old + rows
    saved.write_text(json.dumps(rows, indent=2))
    print(json.dumps(rows, indent=2))
    if not args.no_write:
        write_section("quantdbg:sensitivity", markdown(rows, command))


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()
