"""all-MiniLM-L6-v2: FP32 vs naive INT8 vs quantdbg's automatic result, on retrieval recall@1.

    python examples/minilm_l6.py    # needs the zoo model (../shared/models/minilm_l6_v2_text.py);
                                    # several minutes on 2 cores

* naive INT8: minmax ranges, every MatMul quantized (the issue's starting point);
* quantdbg: the same INT8 model, then the automatic FP16 fallback search for the fewest MatMuls to
  keep out of INT8 so that embedding cosine to FP32 >= 0.99 and recall@1 >= 0.330.

Every variant is finally scored by the builder's own ``--eval`` in its own process.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _zoo import builder_eval, print_table, zoo_folder  # noqa: E402

from quantdbg.backends import OnnxrtRunnerFactory, OrtConfig  # noqa: E402
from quantdbg.config import CalibConfig  # noqa: E402
from quantdbg.evaluation import OutputFunction  # noqa: E402
from quantdbg.fallback import FallbackTarget, auto_fallback  # noqa: E402
from quantdbg.qdq import quantize  # noqa: E402
from quantdbg.sensitivity import VariantEvaluator  # noqa: E402

INPUTS = ("input_ids", "attention_mask", "token_type_ids")
MIN_COSINE = 0.99
MIN_RECALL = 0.330


def _rows_cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a, b = a.astype(np.float64), b.astype(np.float64)
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1) + 1e-12)


def gate(outputs: Mapping[str, np.ndarray], reference: Mapping[str, np.ndarray]) -> float:
    """>= 0 exactly when mean embedding cosine >= 0.99 and recall@1 >= 0.330.

    The evaluation set is the queries followed by their documents (same count), so the first half
    of the embeddings are queries and the second half the documents they should retrieve.
    """
    emb = next(iter(outputs.values()))
    ref = next(iter(reference.values()))
    half = len(emb) // 2
    sim = emb[:half] @ emb[half:].T
    recall = float((sim.argmax(axis=1) == np.arange(half)).mean())
    cosine = float(_rows_cosine(emb, ref).mean())
    return min(cosine - MIN_COSINE, (recall - MIN_RECALL) / 10)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=0, help="ONNX Runtime threads (0: all cores).")
    args = parser.parse_args()

    folder = zoo_folder("minilm_l6_v2_text")
    model = folder / "model.onnx"
    with np.load(folder / "calib.npz") as calib, np.load(folder / "eval.npz") as z:
        calib_arrays = {k: calib[k] for k in INPUTS}
        evals = {k: np.concatenate([z[f"q_{k}"], z[f"d_{k}"]]) for k in INPUTS}
    naive = quantize(model, calib_arrays, CalibConfig(method="minmax"))
    factory = OnnxrtRunnerFactory(OrtConfig(intra_op_num_threads=args.threads))
    gated = OutputFunction(gate, "min(cos-0.99, (R@1-0.330)/10)")
    with VariantEvaluator(model, naive, evals, gated, factory) as evaluator:
        found = auto_fallback(evaluator, FallbackTarget.min_metric(0.0))
    mixed = found.mixed if found.mixed is not None else naive
    n = len(naive.layers)
    with tempfile.TemporaryDirectory() as tmp:
        naive.save(Path(tmp) / "naive.onnx")
        mixed.save(Path(tmp) / "auto.onnx")
        variants = [("FP32", model, 0), ("naive INT8 (minmax)", Path(tmp) / "naive.onnx", n),
                    ("quantdbg (fallback)", Path(tmp) / "auto.onnx", len(mixed.layers))]
        rows = []
        for name, path, count in variants:
            score = builder_eval("minilm_l6_v2_text.py", path)
            rows.append((name, f"{count}/{n}", score["recall_at_1"], score["mrr"],
                         score["emb_cosine_vs_fp32_mean"]))
    print_table(f"all-MiniLM-L6-v2 ({folder}): retrieval on {len(evals['input_ids']) // 2} pairs",
                ["variant", "INT8 MatMuls", "recall@1", "MRR", "cosine vs FP32"], rows)
    print(f"kept out of INT8: {', '.join(found.plan.exclude) or 'none'}")
    print(f"fallback: {found.plan.message}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
