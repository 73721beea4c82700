"""Digits CNN: FP32 vs naive INT8 vs quantdbg's automatic result, on top-1 accuracy.

    python examples/digits_cnn.py          # the digits CNN embedded in quantdbg (offline, ~10 s)
    python examples/digits_cnn.py --zoo    # the zoo's larger digits CNN (../shared/models), also
                                           # scored by its builder's own --eval

* naive INT8: minmax ranges, every Conv/Gemm quantized;
* quantdbg: entropy ranges, then the automatic FP16 fallback search for the smallest set of layers
  to keep out of INT8 so that top-1 loses nothing against FP32.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _zoo import builder_eval, print_table, zoo_folder  # noqa: E402

from quantdbg.backends import OnnxrtRunner, OnnxrtRunnerFactory, OrtConfig  # noqa: E402
from quantdbg.config import CalibConfig  # noqa: E402
from quantdbg.evaluation import Accuracy  # noqa: E402
from quantdbg.fallback import FallbackTarget, auto_fallback  # noqa: E402
from quantdbg.qdq import quantize  # noqa: E402
from quantdbg.sensitivity import VariantEvaluator  # noqa: E402


def load(zoo: bool) -> tuple[object, dict, dict, np.ndarray, str]:
    """(model, calibration arrays, evaluation arrays, labels, description)."""
    if not zoo:
        from quantdbg.demo import load_embedded

        emb = load_embedded()
        return emb.model_path, emb.calib, emb.eval_inputs, emb.labels, "digits CNN embedded in quantdbg"
    folder = zoo_folder("digits_cnn")
    with np.load(folder / "calib.npz") as calib, np.load(folder / "eval.npz") as evals:
        return (folder / "model.onnx", {"input": calib["input"]}, {"input": evals["input"]},
                evals["label"], f"zoo digits CNN ({folder})")


def top1(model: object, inputs: dict, labels: np.ndarray, threads: int) -> float:
    with OnnxrtRunner(model, OrtConfig(intra_op_num_threads=threads)) as runner:
        logits = next(iter(runner.infer(inputs).values()))
    return float((logits.argmax(axis=1) == labels).mean())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--zoo", action="store_true", help="Use the zoo's digits CNN, not the embedded one.")
    parser.add_argument("--threads", type=int, default=0, help="ONNX Runtime threads (0: all cores).")
    args = parser.parse_args()

    model, calib, evals, labels, what = load(args.zoo)
    naive = quantize(model, calib, CalibConfig(method="minmax"))
    auto_int8 = quantize(model, calib, CalibConfig(method="entropy"))
    factory = OnnxrtRunnerFactory(OrtConfig(intra_op_num_threads=args.threads))
    with VariantEvaluator(model, auto_int8, evals, Accuracy(labels), factory) as evaluator:
        found = auto_fallback(evaluator, FallbackTarget.max_relative_loss(0.0))
    mixed = found.mixed if found.mixed is not None else auto_int8
    n = len(naive.layers)
    variants = [("FP32", model, 0), ("naive INT8 (minmax)", naive.model, n),
                ("quantdbg (entropy + fallback)", mixed.model, len(mixed.layers))]
    rows = [(name, f"{count}/{n}", top1(m, evals, labels, args.threads)) for name, m, count in variants]
    columns = ["variant", "INT8 layers", "top-1"]
    if args.zoo:  # the builder's own scoring, in its own process
        with tempfile.TemporaryDirectory() as tmp:
            naive.save(Path(tmp) / "naive.onnx")
            mixed.save(Path(tmp) / "auto.onnx")
            paths = [Path(str(model)), Path(tmp) / "naive.onnx", Path(tmp) / "auto.onnx"]
            scored = [builder_eval("digits_cnn_train.py", p)["top1"] for p in paths]
            rows = [(*row, score) for row, score in zip(rows, scored, strict=True)]
        columns.append("top-1 (builder --eval)")
    print_table(f"{what}: top-1 on {len(labels)} held-out digits", columns, rows)
    print(f"fallback: {found.plan.message}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
