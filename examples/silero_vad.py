"""Silero VAD: FP32 vs naive INT8 vs quantdbg's automatic result, on frame ROC-AUC.

    python examples/silero_vad.py   # needs the zoo model (../shared/models/silero_vad_speech.py)

* naive INT8: minmax ranges, every Conv/MatMul quantized (the LSTM stays in float);
* quantdbg: entropy ranges, then the automatic FP16 fallback search for the fewest layers to keep
  out of INT8 so that the frame ROC-AUC stays within 0.1 % of FP32's.

The task metric is the builder's own ``--eval`` (speech clips in noise, frame labels), run on each
candidate model file in its own process, so the search optimises exactly what is reported.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _zoo import builder_eval, print_table, zoo_folder  # noqa: E402

from quantdbg.backends import OnnxrtRunnerFactory, OrtConfig  # noqa: E402
from quantdbg.config import CalibConfig  # noqa: E402
from quantdbg.evaluation import ModelFunction  # noqa: E402
from quantdbg.fallback import FallbackTarget, auto_fallback  # noqa: E402
from quantdbg.qdq import quantize  # noqa: E402
from quantdbg.sensitivity import VariantEvaluator  # noqa: E402

BUILDER = "silero_vad_speech.py"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=0, help="ONNX Runtime threads (0: all cores).")
    args = parser.parse_args()

    folder = zoo_folder("silero_vad_16k")
    model = folder / "model.onnx"
    with np.load(folder / "calib.npz") as calib:
        # One feed per clip: the model is unbatched (axis 0 is the sequence of frames).
        feeds = [{"input": calib["input"][i], "h": calib["h"][i], "c": calib["c"][i]}
                 for i in range(len(calib["input"]))]
    naive = quantize(model, feeds, CalibConfig(method="minmax"))
    auto_int8 = quantize(model, feeds, CalibConfig(method="entropy"))
    auc = ModelFunction(lambda path: builder_eval(BUILDER, path)["roc_auc"], "roc_auc")
    factory = OnnxrtRunnerFactory(OrtConfig(intra_op_num_threads=args.threads))
    # The ranking runs on the calibration clips; each search step scores a model file with the builder.
    with VariantEvaluator(model, auto_int8, feeds, auc, factory) as evaluator:
        found = auto_fallback(evaluator, FallbackTarget.max_relative_loss(0.1))
    mixed = found.mixed if found.mixed is not None else auto_int8
    n = len(naive.layers)
    with tempfile.TemporaryDirectory() as tmp:
        naive.save(Path(tmp) / "naive.onnx")
        mixed.save(Path(tmp) / "auto.onnx")
        variants = [("FP32", model, 0), ("naive INT8 (minmax)", Path(tmp) / "naive.onnx", n),
                    ("quantdbg (entropy + fallback)", Path(tmp) / "auto.onnx", len(mixed.layers))]
        rows = []
        for name, path, count in variants:
            score = builder_eval(BUILDER, path)
            rows.append((name, f"{count}/{n}", score["roc_auc"], score["f1_at_0.5"]))
    print_table(f"Silero VAD ({folder}): speech frames in 32 noisy clips",
                ["variant", "INT8 layers", "ROC-AUC", "F1@0.5"], rows)
    print(f"kept out of INT8: {', '.join(found.plan.exclude) or 'none'}")
    print(f"fallback: {found.plan.message}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
