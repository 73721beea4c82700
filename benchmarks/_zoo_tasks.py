"""Zoo models as the sensitivity / fallback benchmarks use them: data as feeds, task metrics.

Each task metric reproduces the model builder's own ``--eval`` score from the model's outputs
(see ../shared/models), so a sweep scores every variant in the analysis session instead of
writing a model per variant:

* ``minilm_l6_v2_text``: embedding cosine to FP32 (mean over query and document rows) and
  retrieval recall@1 (queries are the first 351 eval rows, their documents the last 351);
* ``digits_cnn``: top-1 accuracy against the labels;
* ``silero_vad_16k``: frame ROC-AUC against the labels;
* ``mobilenet_digits`` (benchmarks/build_unseen.py): top-1 accuracy against the labels;
* ``crnn_text`` (benchmarks/build_unseen.py): exact string match of the greedy CTC decoding.

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
LABELLED = ("digits_cnn", "mobilenet_digits", "crnn_text")  # one input array, one label row per sample
SILERO_FRAME, SILERO_CONTEXT = 512, 64
CRNN_ALPHABET = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ"  # class 0 of crnn_text is the CTC blank


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
    return float(reciprocal_ranks(queries, docs).mean())


def reciprocal_ranks(queries: np.ndarray, docs: np.ndarray) -> np.ndarray:
    """Per query, 1 / the rank of its own document (same row) among all documents."""
    sim = queries @ docs.T
    return 1.0 / ((sim > np.diag(sim)[:, None]).sum(1) + 1)


def minilm_gate(outputs: Mapping[str, np.ndarray], reference: Mapping[str, np.ndarray]) -> float:
    """min(cosine - 0.99, (recall@1 - 0.330) / 10): >= 0 exactly when both targets hold."""
    return min(minilm_cosine(outputs, reference) - 0.99, (minilm_recall1(outputs, reference) - 0.330) / 10)


def ctc_exact(logits: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """Per strip, 1.0 when the greedy CTC decoding of ``logits`` (N, T, classes; blank 0) equals the
    label row (class indices, 0-padded), else 0.0."""
    best = np.asarray(logits).argmax(-1)
    keep = np.ones_like(best, bool)
    keep[:, 1:] = best[:, 1:] != best[:, :-1]
    keep &= best != 0
    return np.array([np.array_equal(row[k], lab[lab > 0])
                     for row, k, lab in zip(best, keep, labels, strict=True)], np.float64)


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
    if name in LABELLED:
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


def bench_task(name: str, scratch: Path) -> ZooTask:
    """The zoo task as the automatic-flow benchmark scores it: MiniLM's evaluation rows interleaved
    (query, its paragraph, ...), so a leading part of the set is a set of whole pairs."""
    loaded = load_task(name, scratch)
    if name != "minilm_l6_v2_text":
        return loaded
    n = len(next(iter(loaded.eval.values()))) // 2
    pairs = {k: np.stack([a[:n], a[n:]], axis=1).reshape(2 * n, *a.shape[1:]) for k, a in loaded.eval.items()}
    return ZooTask(loaded.name, loaded.model, loaded.calib, pairs, None, None)


def task_items(task: ZooTask) -> list[tuple[dict[str, np.ndarray], Any]]:
    """The evaluation set of :func:`bench_task` as scored items, each (feed, label): one image or strip
    (feed of one row), one (query, paragraph) pair (feed of two rows), or one clip with its frame labels."""
    if isinstance(task.eval, list):  # Silero: one feed per clip
        return [(feed, task.labels[i]) for i, feed in enumerate(task.eval)]
    rows = 2 if task.name == "minilm_l6_v2_text" else 1
    n = len(next(iter(task.eval.values()))) // rows
    return [({k: a[i * rows:(i + 1) * rows] for k, a in task.eval.items()},
             None if task.labels is None else task.labels[i]) for i in range(n)]


def score_items(name: str, outputs: list[np.ndarray], labels: list[Any]) -> tuple[float, list[float] | None]:
    """The task metric of the scored items (each item's first model output) and, when the metric is a
    mean over items, each item's value (None for a frame ROC-AUC, which is not a mean over clips)."""
    if name == "silero_vad_16k":
        frames = [np.asarray(y).reshape(-1)[:o.size] for o, y in zip(outputs, labels, strict=True)]
        probs = np.concatenate([o.reshape(-1) for o in outputs])
        return silero_auc({"p": probs}, np.concatenate(frames)), None
    if name == "minilm_l6_v2_text":
        emb = np.stack(outputs).astype(np.float64)  # (items, 2, dim): query, its paragraph
        values = reciprocal_ranks(emb[:, 0], emb[:, 1])
    elif name == "crnn_text":
        values = ctc_exact(np.concatenate(outputs), np.stack(labels))
    else:
        values = (np.concatenate(outputs).argmax(-1) == np.asarray(labels)).astype(np.float64)
    return float(values.mean()), [float(v) for v in values]


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
