"""Trains the embedded default model: a small CNN on scikit-learn's UCI digits, exported to ONNX.

Writes ``src/quantdbg/_data/digits_cnn.onnx`` and ``src/quantdbg/_data/digits.npz`` (the raw 8x8
scans as uint8 plus labels; :func:`quantdbg.demo.preprocess_digits` turns them into inputs).
Needs PyTorch, onnxscript and scikit-learn (not quantdbg dependencies), so it runs in its own
environment, e.g.::

    /tmp/qdbg_venv/bin/python examples/train_digits.py            # ~1 min on 2 cores
    /tmp/qdbg_venv/bin/python examples/train_digits.py --out DIR  # write elsewhere

Deterministic: fixed seeds, 2 threads, deterministic kernels; the stratified 1257/540 split is
the one ``../shared/models/digits_cnn_train.py`` uses.

The network is shaped to exercise every Q/DQ placement rule on a small graph: Conv (BatchNorm
folded into it before export), a residual block whose second Conv feeds an Add with the skip
connection, max pooling, Flatten, and a two-layer Gemm head.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))
from quantdbg.demo import INPUT_NAME, OUTPUT_NAME, preprocess_digits  # noqa: E402

N_CALIB = 256
N_TEST = 540
SEED = 0


def split() -> dict[str, np.ndarray]:
    """Returns the raw uint8 scans and labels of the train/test split and the calibration subset."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    pixels = digits.images.astype(np.uint8)  # integer intensities 0..16
    xtr, xte, ytr, yte = train_test_split(pixels, digits.target.astype(np.uint8), test_size=N_TEST,
                                          stratify=digits.target, random_state=SEED)
    calib_idx = np.random.default_rng(SEED).permutation(len(xtr))[:N_CALIB]
    return {"train_pixels": xtr, "train_labels": ytr, "test_pixels": xte, "test_labels": yte,
            "calib_pixels": xtr[calib_idx]}


def build_net():
    """Returns the (unfused) training network."""
    import torch
    from torch import nn

    def conv_bn(cin: int, cout: int) -> nn.Sequential:
        return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout))

    class DigitsNet(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.stem = conv_bn(1, 16)
            self.conv2 = conv_bn(16, 32)
            self.res_conv1 = conv_bn(32, 32)
            self.res_conv2 = conv_bn(32, 32)
            self.conv3 = conv_bn(32, 64)
            self.fc1 = nn.Linear(64 * 4 * 4, 32)
            self.fc2 = nn.Linear(32, 10)
            self.pool = nn.MaxPool2d(2)
            self.drop = nn.Dropout(0.2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x = torch.relu(self.stem(x))
            x = self.pool(torch.relu(self.conv2(x)))               # 8x8
            y = torch.relu(self.res_conv1(x))
            x = torch.relu(self.res_conv2(y) + x)                  # residual Add fed by a Conv
            x = self.pool(torch.relu(self.conv3(x)))               # 4x4
            x = torch.flatten(x, 1)
            return self.fc2(self.drop(torch.relu(self.fc1(x))))

    return DigitsNet()


def train(net, x: np.ndarray, y: np.ndarray, epochs: int) -> list[float]:
    """Trains ``net`` in place with AdamW + one-cycle; returns the last loss of each epoch."""
    import torch

    X, Y = torch.from_numpy(x), torch.from_numpy(y.astype(np.int64))
    steps = epochs * -(-len(X) // 64)
    opt = torch.optim.AdamW(net.parameters(), 2e-3, weight_decay=1e-4)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, 5e-3, total_steps=steps)
    gen = torch.Generator().manual_seed(SEED)
    losses = []
    for _ in range(epochs):
        net.train()
        perm = torch.randperm(len(X), generator=gen)
        for start in range(0, len(X), 64):
            idx = perm[start:start + 64]
            # Augmentation: shift the batch by up to 2 pixels (one source pixel) each way.
            dy, dx = torch.randint(-2, 3, (2,), generator=gen).tolist()
            xb = torch.roll(X[idx], (dy, dx), (2, 3))
            loss = torch.nn.functional.cross_entropy(net(xb), Y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
        losses.append(round(float(loss.detach()), 4))
    net.eval()
    return losses


def fold_batchnorm(net) -> None:
    """Replaces each Conv+BatchNorm pair by one Conv with bias (what inference engines run)."""
    from torch import nn
    from torch.nn.utils.fusion import fuse_conv_bn_eval

    for name, child in list(net.named_children()):
        if isinstance(child, nn.Sequential) and len(child) == 2 and isinstance(child[1], nn.BatchNorm2d):
            setattr(net, name, fuse_conv_bn_eval(child[0], child[1]))


def export(net, path: Path) -> None:
    """Exports with a dynamic batch dim at opset 17 and gives the nodes readable names."""
    import onnx
    import torch

    batch = torch.export.Dim("batch", min=1, max=4096)
    program = torch.onnx.export(net, (torch.zeros(2, 1, 16, 16),), dynamo=True, opset_version=17,
                                input_names=[INPUT_NAME], output_names=[OUTPUT_NAME],
                                dynamic_shapes=({0: batch},), external_data=False)
    program.optimize()
    model = program.model_proto
    name_nodes(model)
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, str(path))


def name_nodes(model) -> None:
    """Names each node after the weight it uses (``conv2/Conv``) or the previous named node.

    Layers are identified by ONNX node name everywhere in quantdbg, so the embedded model gets
    stable, meaningful names instead of the exporter's counters.
    """
    inits = {init.name for init in model.graph.initializer}
    scope, used = "input", set()
    for node in model.graph.node:
        weights = [i for i in node.input if i in inits and i.endswith("weight")]
        if weights:
            scope = weights[0].rsplit(".", 1)[0].replace(".", "/")
        name, k = f"{scope}/{node.op_type}", 1
        while name in used:
            k += 1
            name = f"{scope}/{node.op_type}_{k}"
        node.name = name
        used.add(name)


def evaluate(path: Path, x: np.ndarray, y: np.ndarray) -> float:
    """Top-1 accuracy of the ONNX model through ONNX Runtime (one thread)."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    logits = sess.run(None, {INPUT_NAME: x})[0]
    return float((logits.argmax(1) == y).mean())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "src" / "quantdbg" / "_data")
    parser.add_argument("--epochs", type=int, default=30)
    args = parser.parse_args()

    import torch

    start = time.time()
    torch.manual_seed(SEED)
    torch.set_num_threads(2)
    torch.use_deterministic_algorithms(True)
    data = split()
    net = build_net()
    losses = train(net, preprocess_digits(data["train_pixels"]), data["train_labels"], args.epochs)
    fold_batchnorm(net)
    args.out.mkdir(parents=True, exist_ok=True)
    model_path = args.out / "digits_cnn.onnx"
    export(net, model_path)
    np.savez_compressed(args.out / "digits.npz", calib_pixels=data["calib_pixels"],
                        eval_pixels=data["test_pixels"], eval_labels=data["test_labels"])
    x_test = preprocess_digits(data["test_pixels"])
    with torch.no_grad():
        torch_top1 = float((net(torch.from_numpy(x_test)).argmax(1).numpy() == data["test_labels"]).mean())
    summary = {"fp32_top1_onnx": evaluate(model_path, x_test, data["test_labels"]),
               "fp32_top1_torch": torch_top1, "epochs": args.epochs, "loss_per_epoch": losses,
               "seconds": round(time.time() - start, 1),
               "bytes": {p.name: p.stat().st_size for p in (model_path, args.out / "digits.npz")}}
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
