"""Zoo models as the sensitivity / fallback benchmarks use them: data as feeds, task metrics.

Each task metric reproduces the model builder's own ``--eval`` score from the model's outputs
(see ../shared/models), so a sweep scores every variant in the analysis session instead of
writing a model per variant:

* ``minilm_l6_v2_text``: embedding cosine to FP32 (mean over query and document rows) and
  retrieval recall@1 (queries are the first 351 eval rows, their documents the last 351);
* ``digits_cnn``: top-1 accuracy against the labels;
* ``silero_vad_16k``: frame ROC-AUC against the labels.

Run ``python benchmarks/_zoo_tasks.py NAME METRIC MODEL.onnx`` to print one metric of a model
file as the last line, which makes it a ``quantdbg fallback --evaluate`` command.
"""
from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

ZOO = Path(os.environ.get("QDBG_MODELS", "/tmp/qdbg_models"))
MINILM_INPUTS = ("input_ids", "attention_mask", "token_type_ids")
SILERO_FRAME, SILERO_CONTEXT = 512, 64


def _cosine_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a = a.reshape(len(a), -1).astype(np.float64)
    b = b.reshape(len(b), -1).astype(np.float64)
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1) + 1e-12)


def minilm_cosine(outputs: Mapping[str, np.ndarray], reference: Mapping[str, np.ndarray]) -> float:
    """Mean embedding cosine to FP32 over every query and document row."""
    return float(_cosine_rows(reference["sentence_embedding"], outputs["sentence_embedding"]).mean())


def minilm_recall1(outputs: Mapping[str, np.ndarray], reference: Mapping[str, np.ndarray]) -> float:
    """Recall@1 of each query (first half of the rows) against all documents (second half)."""
    emb = outputs["sentence_embedding"].astype(np.float64)
    n = len(emb) // 2
    sim = emb[:n] @ emb[n:].T
    return float(((sim > np.diag(sim)[:, None]).sum(1) == 0).mean())


def minilm_mrr(outputs: Mapping[str, np.ndarray], reference: Mapping[str, np.ndarray]) -> float:
    """Mean reciprocal rank of each query's own document among all documents (the builder's MRR)."""
    emb = outputs["sentence_embedding"].astype(np.float64)
    n = len(emb) // 2
    return mrr(emb[:n], emb[n:])


def mrr(queries: np.ndarray, docs: np.ndarray) -> float:
    """Mean reciprocal rank of each query's own document (same row) among all documents."""
    sim = queries @ docs.T
    rank = (sim > np.diag(sim)[:, None]).sum(1) + 1
    return float((1.0 / rank).mean())


def minilm_gate(outputs: Mapping[str, np.ndarray], reference: Mapping[str, np.ndarray]) -> float:
    """min(cosine - 0.99, (recall@1 - 0.330) / 10): >= 0 exactly when both targets hold."""
    return min(minilm_cosine(outputs, reference) - 0.99, (minilm_recall1(outputs, reference) - 0.330) / 10)


def silero_auc(outputs: Mapping[str, np.ndarray], labels: np.ndarray) -> float:
    """Frame ROC-AUC of the speech probabilities (rank formula of the builder)."""
    p = np.asarray(outputs[next(iter(outputs))]).reshape(-1)
    y = labels.reshape(-1).astype(bool)
    r = np.argsort(np.argsort(p)) + 1
    npos = y.sum()
    return float((r[y].sum() - npos * (npos + 1) / 2) / (npos * (len(y) - npos)))


def silero_f1(outputs: Mapping[str, np.ndarray], labels: np.ndarray) -> float:
    """Frame F1 of the speech decision at probability 0.5 (the builder's ``f1_at_0.5``)."""
    pred = np.asarray(outputs[next(iter(outputs))]).reshape(-1) >= 0.5
    y = labels.reshape(-1).astype(bool)
    tp, fp, fn = (pred & y).sum(), (pred & ~y).sum(), (~pred & y).sum()
    return float(2 * tp / max(2 * tp + fp + fn, 1))


def _silero_frames(audio: np.ndarray) -> np.ndarray:
    t = len(audio) // SILERO_FRAME
    frames = audio[: t * SILERO_FRAME].reshape(t, SILERO_FRAME)
    ctx = np.zeros((t, SILERO_CONTEXT), np.float32)
    ctx[1:] = frames[:-1, -SILERO_CONTEXT:]
    return np.concatenate([ctx, frames], 1).astype(np.float32)


@dataclass(frozen=True)
class ZooTask:
    """One zoo model prepared for analysis.

    Attributes:
        name: Zoo folder name.
        model: FP32 model path.
        calib: Calibration data (arrays or feeds).
        eval: Evaluation data (arrays or feeds).
        eval_npz: Evaluation arrays keyed by model input (written for the CLI), or None.
        labels: Evaluation labels, when the task has them.
    """

    name: str
    model: Path
    calib: Any
    eval: Any
    eval_npz: Path | None
    labels: np.ndarray | None


def load_task(name: str, scratch: Path) -> ZooTask:
    """Loads a zoo model's data; writes an input-keyed eval ``.npz`` into ``scratch`` for the CLI."""
    folder = ZOO / name
    if not (folder / "model.onnx").is_file():
        raise FileNotFoundError(f"zoo model {name!r} is not built at {folder} (see ../shared/models)")
    scratch.mkdir(parents=True, exist_ok=True)
    if name == "minilm_l6_v2_text":
        z = np.load(folder / "eval.npz")
        arrays = {k: np.concatenate([z["q_" + k], z["d_" + k]]) for k in MINILM_INPUTS}
        path = scratch / "minilm_eval.npz"
        np.savez(path, **arrays)
        c = np.load(folder / "calib.npz")
        return ZooTask(name, folder / "model.onnx", {k: c[k] for k in MINILM_INPUTS}, arrays, path, None)
    if name == "digits_cnn":
        z = np.load(folder / "eval.npz")
        c = np.load(folder / "calib.npz")
        return ZooTask(name, folder / "model.onnx", {"input": c["input"]}, {"input": z["input"]},
                       folder / "eval.npz", z["label"])
    if name == "silero_vad_16k":
        z = np.load(folder / "eval.npz")
        c = np.load(folder / "calib.npz")
        zero = np.zeros((1, 1, 128), np.float32)
        calib = [{"input": c["input"][i], "h": c["h"][i], "c": c["c"][i]} for i in range(len(c["input"]))]
        evals = [{"input": _silero_frames(a), "h": zero, "c": zero} for a in z["audio"]]
        return ZooTask(name, folder / "model.onnx", calib, evals, None, z["label"])
    raise KeyError(f"unknown zoo task {name!r}")


def _main(argv: list[str]) -> None:
    import onnxruntime as ort

    name, metric, model = argv
    task = load_task(name, Path(os.environ.get("TMPDIR", "/tmp")) / "quantdbg_zoo_tasks")
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.log_severity_level = 3
    options.add_session_config_entry("session.disable_quant_qdq", "1")  # Q/DQ as ONNX defines it

    def run(path: str) -> dict[str, np.ndarray]:
        session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
        names = [o.name for o in session.get_outputs()]
        n = len(next(iter(task.eval.values()))) if isinstance(task.eval, dict) else 0
        feeds = task.eval if isinstance(task.eval, list) else [
            {k: v[i:i + 32] for k, v in task.eval.items()} for i in range(0, n, 32)]
        outs = [dict(zip(names, session.run(None, feed), strict=True)) for feed in feeds]
        return {k: np.concatenate([o[k] for o in outs]) for k in names}

    # The FP32 reference is computed once per zoo model and kept beside the scratch eval data.
    cache = Path(os.environ.get("TMPDIR", "/tmp")) / "quantdbg_zoo_tasks" / f"{name}_reference.npz"
    if not cache.exists():
        np.savez(cache, **run(str(task.model)))
    with np.load(cache) as saved:
        reference = {k: saved[k] for k in saved.files}
    outputs = run(model)
    fn = {"cosine": minilm_cosine, "recall1": minilm_recall1, "mrr": minilm_mrr, "gate": minilm_gate}[metric]
    print(fn(outputs, reference))



RESULTS = Path(__file__).resolve().parent / "RESULTS.md"


def run_command(script: str, work: Path, report_only: bool) -> str:
    """The command line behind the rows saved in ``work``, for the RESULTS.md section.

    A measuring run records its own command there; a ``--report-only`` run reports the recorded
    one. ``--no-write`` and ``--report-only`` are left out: they decide where the report goes,
    not what was measured.
    """
    saved = work / f"{Path(script).stem}_command.txt"
    if report_only and saved.exists():
        return saved.read_text().strip()
    command = " ".join(["python", f"benchmarks/{script}",
                        *(a for a in sys.argv[1:] if a not in ("--no-write", "--report-only"))])
    if not report_only:
        saved.write_text(command + "\n")
    return command


def write_section(key: str, text: str, path: Path = RESULTS) -> None:
    """Replaces (or appends) the section between ``<!-- key:start -->`` and ``<!-- key:end -->``.

    Other sections of the file are left byte for byte as they are; the file is replaced atomically.
    """
    start, end = f"<!-- {key}:start -->", f"<!-- {key}:end -->"
    block = f"{start}\n{text.rstrip()}\n{end}"
    old = path.read_text() if path.exists() else "# Benchmark results\n"
    if start in old and end in old:
        head, rest = old.split(start, 1)
        new = head + block + rest.split(end, 1)[1]  # what follows the end marker stays as it was
    else:
        new = old.rstrip("\n") + "\n\n" + block + "\n"
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(new)
    os.replace(tmp, path)


if __name__ == "__main__":
    _main(sys.argv[1:])
