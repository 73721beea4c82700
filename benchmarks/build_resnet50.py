"""Build a ResNet-50-shaped CNN as ONNX plus natural-image calibration data, fully offline.

What it is: the ResNet-50 v1.5 bottleneck architecture (3-4-6-3 bottleneck blocks, widths
64-128-256-512 x4, stride on the 3x3 convolution, 1000-way classifier, 25.6 M parameters),
written in plain PyTorch because torchvision cannot be imported beside the CPU torch build
used here. The weights are RANDOM (fixed seed, Kaiming-normal fan-out as torchvision
initialises them), so the model has no task accuracy: it exists to measure calibration cost
(wall time, peak memory) and Q/DQ placement on a graph with ResNet-50's operators, tensor
sizes and residual structure. To give the activations realistic, unit-scale per-channel
statistics instead of the vanishing/exploding ranges of an untrained stack, the BatchNorm
running statistics are estimated on 64 crops that are not in calib.npz (cumulative average,
train mode, no gradient), then every BatchNorm is folded into its convolution, as deployment
exports do. The exported graph holds Conv, Relu, Add, MaxPool, AveragePool, Reshape and Gemm only.

Export: torch.onnx.export(dynamo=True), opset 17, input ``input`` [batch, 3, 224, 224] with a
dynamic batch dimension, output ``logits`` [batch, 1000], weights inside the .onnx file.

Calibration data (calib.npz, key ``input``, float32 [N, 3, 224, 224], N=512 by default):
random resized crops (area 25-100 %, aspect 3/4-4/3, random horizontal flip) of the photos
that ship inside the scikit-image, scikit-learn and matplotlib wheels (astronaut, chelsea,
coffee, rocket, motorcycle, hubble deep field, retina, china, flower, grace_hopper, and the
greyscale camera/moon/coins/brick/grass/gravel/horse/page/text replicated to RGB), resized to
224x224 bilinearly and normalised with the ImageNet mean/std. Nothing is downloaded.

  /tmp/qdbg_venv/bin/python benchmarks/build_resnet50.py [--n 512] [--out DIR]

Writes DIR (default $QDBG_MODELS/resnet50_shape, QDBG_MODELS defaulting to /tmp/qdbg_models):
model.onnx, calib.npz, metrics_fp32.json (build facts: parameter count, PyTorch vs ONNX
Runtime max-abs difference, logit statistics; no accuracy, since the weights are random).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import time
from pathlib import Path

import numpy as np

NAME = "resnet50_shape"
SIZE = 224
MEAN = np.array([0.485, 0.456, 0.406], np.float32)
STD = np.array([0.229, 0.224, 0.225], np.float32)
COLOR = ["astronaut.png", "chelsea.png", "coffee.png", "rocket.jpg", "motorcycle_left.png",
         "motorcycle_right.png", "hubble_deep_field.jpg", "retina.jpg", "color.png"]
GREY = ["camera.png", "moon.png", "coins.png", "brick.png", "grass.png", "gravel.png", "horse.png",
        "page.png", "text.png"]


def source_images() -> list[np.ndarray]:
    """Every photo shipped in the installed wheels, as HxWx3 uint8 arrays."""
    import matplotlib
    import skimage
    import sklearn.datasets
    from PIL import Image

    sk = Path(skimage.__file__).parent / "data"
    paths = [sk / n for n in COLOR + GREY]
    paths += sorted((Path(sklearn.datasets.__file__).parent / "images").glob("*.jpg"))
    paths.append(Path(matplotlib.get_data_path()) / "sample_data" / "grace_hopper.jpg")
    out = []
    for p in paths:
        img = Image.open(p)
        out.append(np.asarray(img.convert("RGB")))
    return out


def random_crops(images: list[np.ndarray], n: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` random resized crops, normalised, NCHW float32."""
    from PIL import Image

    x = np.empty((n, 3, SIZE, SIZE), np.float32)
    for i in range(n):
        img = images[rng.integers(len(images))]
        h, w = img.shape[:2]
        area = rng.uniform(0.25, 1.0) * h * w
        ratio = np.exp(rng.uniform(np.log(3 / 4), np.log(4 / 3)))
        cw = int(min(w, round(np.sqrt(area * ratio))))
        ch = int(min(h, round(np.sqrt(area / ratio))))
        top, left = rng.integers(h - ch + 1), rng.integers(w - cw + 1)
        crop = Image.fromarray(img[top:top + ch, left:left + cw]).resize((SIZE, SIZE), Image.BILINEAR)
        a = np.asarray(crop, np.float32) / 255.0
        if rng.random() < 0.5:
            a = a[:, ::-1]
        x[i] = ((a - MEAN) / STD).transpose(2, 0, 1)
    return x


def resnet50():
    """ResNet-50 v1.5 in plain torch (torchvision's layout and initialisation)."""
    import torch.nn as nn

    class Bottleneck(nn.Module):
        def __init__(self, cin: int, width: int, stride: int):
            super().__init__()
            cout = width * 4
            self.conv1, self.bn1 = nn.Conv2d(cin, width, 1, bias=False), nn.BatchNorm2d(width)
            self.conv2 = nn.Conv2d(width, width, 3, stride, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(width)
            self.conv3, self.bn3 = nn.Conv2d(width, cout, 1, bias=False), nn.BatchNorm2d(cout)
            self.relu = nn.ReLU()
            self.down = None
            if stride != 1 or cin != cout:
                self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

        def forward(self, x):
            y = self.relu(self.bn1(self.conv1(x)))
            y = self.relu(self.bn2(self.conv2(y)))
            y = self.bn3(self.conv3(y))
            return self.relu(y + (x if self.down is None else self.down(x)))

    layers, cin = [], 64
    for width, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
        for b in range(blocks):
            layers.append(Bottleneck(cin, width, stride if b == 0 else 1))
            cin = width * 4
    net = nn.Sequential(nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(),
                        nn.MaxPool2d(3, 2, 1), *layers,
                        # a fixed 7x7 AveragePool, not AdaptiveAvgPool2d: the latter exports as
                        # ReduceMean with an axes input, which onnx cannot convert down to opset 17
                        nn.AvgPool2d(7), nn.Flatten(),
                        nn.Linear(2048, 1000))
    for m in net.modules():
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
    return net


def fold_batchnorm(net):
    """Replace every Conv+BatchNorm pair by one Conv with bias (eval-mode arithmetic)."""
    import torch
    import torch.nn as nn

    def fold(conv: nn.Conv2d, bn: nn.BatchNorm2d) -> nn.Conv2d:
        scale = bn.weight / torch.sqrt(bn.running_var + bn.eps)
        fused = nn.Conv2d(conv.in_channels, conv.out_channels, conv.kernel_size, conv.stride,
                          conv.padding, bias=True)
        fused.weight.data = conv.weight.data * scale[:, None, None, None]
        fused.bias.data = bn.bias - bn.running_mean * scale
        return fused

    def walk(mod: nn.Module) -> None:
        names = list(mod._modules)
        for a, b in zip(names, names[1:], strict=False):
            ca, cb = mod._modules[a], mod._modules[b]
            if isinstance(ca, nn.Conv2d) and isinstance(cb, nn.BatchNorm2d):
                mod._modules[a], mod._modules[b] = fold(ca, cb), nn.Identity()
        for child in mod._modules.values():
            walk(child)

    with torch.no_grad():
        walk(net)
    return net


def build(n: int, out: Path) -> dict:
    """Build model.onnx, calib.npz and metrics_fp32.json under ``out``; return the metrics."""
    import torch

    t0 = time.time()
    torch.manual_seed(0)
    torch.set_num_threads(2)
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    images = source_images()
    bn_set = random_crops(images, 64, np.random.default_rng(1))  # disjoint from calib (other seed)
    calib = random_crops(images, n, rng)

    net = resnet50()
    for m in net.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.momentum = None  # cumulative average over the BN-estimation batches
    net.train()
    with torch.no_grad():
        for i in range(0, len(bn_set), 16):
            net(torch.from_numpy(bn_set[i:i + 16]))
    net = fold_batchnorm(net.eval()).eval()

    onnx_path = out / "model.onnx"
    torch.onnx.export(net, (torch.from_numpy(calib[:2]),), str(onnx_path), dynamo=True, opset_version=17,
                      input_names=["input"], output_names=["logits"],
                      dynamic_shapes=({0: torch.export.Dim("batch", min=1, max=4096)},),
                      external_data=False)
    np.savez(out / "calib.npz", input=calib)

    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    sess = ort.InferenceSession(str(onnx_path), so, providers=["CPUExecutionProvider"])
    ref = sess.run(None, {"input": calib[:16]})[0]
    with torch.no_grad():
        pt = net(torch.from_numpy(calib[:16])).numpy()
    digest = hashlib.sha256(onnx_path.read_bytes()).hexdigest()
    import onnx

    opset = next(o.version for o in onnx.load(str(onnx_path)).opset_import if o.domain in ("", "ai.onnx"))
    metrics = {
        "weights": "random (seed 0), BatchNorm statistics estimated on 64 held-out crops, then folded",
        "params": int(sum(p.numel() for p in net.parameters())),
        "n_calib": n, "input_shape": [None, 3, SIZE, SIZE], "opset": opset,
        "pytorch_vs_ort_max_abs": float(np.abs(pt - ref).max()),
        "logits_std": float(ref.std()), "logits_absmax": float(np.abs(ref).max()),
        "calib_absmax": float(np.abs(calib).max()),
        "build_s": round(time.time() - t0, 2),
        "onnx": {"path": str(onnx_path), "bytes": onnx_path.stat().st_size, "sha256": digest},
    }
    (out / "metrics_fp32.json").write_text(json.dumps(metrics, indent=2, sort_keys=True) + "\n")
    return metrics


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=512, help="calibration samples (default 512)")
    ap.add_argument("--out", type=Path,
                    default=Path(os.environ.get("QDBG_MODELS", "/tmp/qdbg_models")) / NAME)
    a = ap.parse_args()
    print(json.dumps(build(a.n, a.out), indent=2))


if __name__ == "__main__":
    main()
