"""Builds two zoo models of kinds the tests never saw, trained briefly on data that ships in wheels.

* ``mobilenet_digits``: a MobileNet-v2-like depthwise-separable classifier (13 conv/Gemm layers,
  ReLU6, BatchNorm folded into the convolutions) on 32x32 RGB scenes: a scikit-learn digit, scaled,
  inked in a contrasting colour and placed at random on a dimmed crop of scikit-learn's sample
  photographs, plus noise. Task:
  top-1 over 10 classes. Train: 6 scenes of each of the 1257 training digits; eval: 1080
  scenes of the 540 held-out digits; calibration: 256 scenes of training digits.
* ``crnn_text``: a text-recognition-shaped plain conv stack (34 convolutions, residual blocks, no
  recurrent layer; 24 output columns over 37 classes, class 0 the CTC blank) reading 4-7
  characters (0-9, A-Z) rendered on 32x96 grey strips in the DejaVu and STIX fonts matplotlib
  ships. Trained briefly with a per-column cross-entropy (the characters sit in known cells, which
  trains in minutes where CTC needs far longer); read with greedy CTC decoding. Its weights are
  written as ``Constant`` nodes, as Paddle-style exports do. Task: exact string match over 800 strips.

Run with the builders' torch venv (../shared/models/setup_venv.sh), one model at a time:

    /tmp/qdbg_venv/bin/python benchmarks/build_unseen.py mobilenet_digits   # ~2.5 min on 2 busy cores
    /tmp/qdbg_venv/bin/python benchmarks/build_unseen.py crnn_text          # ~26 min on 2 busy cores

Outputs go to ``$QDBG_MODELS/<name>/`` (default /tmp/qdbg_models): model.onnx, calib.npz (key
``input``), eval.npz (``input`` and ``label``; crnn_text's labels are the strings' character
indices, 0-padded, one row per strip) and metrics_fp32.json. Never committed. Deterministic:
fixed seeds, one torch thread.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
sys.path.insert(0, str(HERE))
import export_forms  # noqa: E402
from _zoo_tasks import CRNN_ALPHABET, ctc_exact  # noqa: E402

ZOO = Path(os.environ.get("QDBG_MODELS", "/tmp/qdbg_models"))
MAX_CHARS = 7
TIME_STEPS = 24  # crnn_text's output columns (96 px / 4)


# ---- data ---------------------------------------------------------------------------------------

def _digits() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    d = load_digits()
    return train_test_split(d.images.astype(np.float32) / 16.0, d.target.astype(np.int64), test_size=540,
                            stratify=d.target, random_state=0)


def _backgrounds() -> list[np.ndarray]:
    from sklearn.datasets import load_sample_images

    return [im.astype(np.float32) / 255.0 for im in load_sample_images().images]


def digit_scenes(images: np.ndarray, n_per: int, rng: np.random.Generator) -> np.ndarray:
    """``n_per`` 3x32x32 scenes of each digit: scaled 16-28 px, inked in a colour that contrasts with a
    dimmed photo crop behind it, plus noise."""
    from PIL import Image

    backs = _backgrounds()
    out = np.empty((len(images) * n_per, 3, 32, 32), np.float32)
    for k in range(len(out)):
        img = images[k % len(images)]
        size = int(rng.integers(16, 29))
        glyph = np.asarray(Image.fromarray(img).resize((size, size), Image.BILINEAR), np.float32)
        back = backs[int(rng.integers(len(backs)))]
        y0, x0 = int(rng.integers(back.shape[0] - 32)), int(rng.integers(back.shape[1] - 32))
        scene = back[y0:y0 + 32, x0:x0 + 32] * rng.uniform(0.3, 0.8)
        oy, ox = int(rng.integers(0, 33 - size)), int(rng.integers(0, 33 - size))
        alpha = np.clip(glyph, 0, 1)[..., None] * rng.uniform(0.7, 1.0)
        dark = scene.mean() > 0.4  # dark ink on a bright crop, bright ink on a dark one
        colour = (rng.uniform(0, 0.25, 3) if dark else rng.uniform(0.6, 1.0, 3)).astype(np.float32)
        patch = scene[oy:oy + size, ox:ox + size]
        scene[oy:oy + size, ox:ox + size] = patch * (1 - alpha) + colour * alpha
        scene += rng.normal(0, rng.uniform(0.02, 0.1), scene.shape)
        out[k] = ((np.clip(scene, 0, 1) - 0.5) / 0.5).transpose(2, 0, 1)
    return out


def _fonts() -> list[Path]:
    import matplotlib

    ttf = Path(matplotlib.get_data_path()) / "fonts" / "ttf"
    families = ("DejaVuSans", "DejaVuSerif", "STIXGeneral")
    return sorted(p for p in ttf.glob("*.ttf") if p.name.startswith(families))


def text_strips(n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``n`` 1x32x96 strips of 4-7 random characters, each drawn centred in its own cell of a pitch of
    11-13 px (font, size, start, ink, blur and noise at random).

    Returns:
        The strips, their labels (alphabet index + 1, 0-padded to MAX_CHARS) and per-column targets
        (TIME_STEPS columns of 4 px: the character whose cell centre falls in the column, else 0 =
        blank), so a greedy CTC decoding of ideal column scores reads the label.
    """
    from PIL import Image, ImageDraw, ImageFilter, ImageFont

    fonts = _fonts()
    x = np.empty((n, 1, 32, 96), np.float32)
    labels = np.zeros((n, MAX_CHARS), np.int64)
    columns = np.zeros((n, TIME_STEPS), np.int64)
    for k in range(n):
        length = int(rng.integers(4, MAX_CHARS + 1))
        idx = rng.integers(len(CRNN_ALPHABET), size=length)
        font = ImageFont.truetype(str(fonts[int(rng.integers(len(fonts)))]), int(rng.integers(15, 20)))
        pitch = int(rng.integers(11, 14))
        x0 = int(rng.integers(0, 96 - pitch * length + 1))
        img = Image.new("L", (96, 32), int(255 * rng.uniform(0.55, 1.0)))
        draw = ImageDraw.Draw(img)
        ink, y = int(255 * rng.uniform(0.0, 0.4)), int(rng.integers(12, 21))
        for i, c in enumerate(idx):
            centre = x0 + pitch * i + pitch // 2
            draw.text((centre, y), CRNN_ALPHABET[c], fill=ink, font=font, anchor="mm")
            columns[k, min(centre // 4, TIME_STEPS - 1)] = c + 1
        img = img.filter(ImageFilter.GaussianBlur(float(rng.uniform(0, 0.8))))
        arr = np.asarray(img, np.float32) / 255.0 + rng.normal(0, rng.uniform(0.01, 0.08), (32, 96))
        x[k, 0] = (np.clip(arr, 0, 1) - 0.5) / 0.5
        labels[k, :length] = idx + 1
    return x, labels, columns


# ---- networks -----------------------------------------------------------------------------------

def _cbr(i: int, o: int, k=3, s=1, groups=1, act=True, pad=None):
    import torch.nn as nn

    if pad is None:
        pad = (k[0] // 2, k[1] // 2) if isinstance(k, tuple) else k // 2
    layers = [nn.Conv2d(i, o, k, s, pad, groups=groups, bias=False), nn.BatchNorm2d(o)]
    return nn.Sequential(*layers, nn.ReLU6() if act else nn.Identity())


def mobilenet():
    import torch
    import torch.nn as nn

    class InvertedResidual(nn.Module):
        def __init__(self, i: int, o: int, t: int, s: int):
            super().__init__()
            hidden = i * t
            expand = [_cbr(i, hidden, 1)] if t != 1 else []
            depthwise = _cbr(hidden, hidden, 3, s, groups=hidden)
            self.body = nn.Sequential(*expand, depthwise, _cbr(hidden, o, 1, act=False))
            self.residual = s == 1 and i == o

        def forward(self, x):
            return x + self.body(x) if self.residual else self.body(x)

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.features = nn.Sequential(_cbr(3, 16, 3, 2), InvertedResidual(16, 16, 1, 1),
                                          InvertedResidual(16, 24, 4, 2), InvertedResidual(24, 24, 4, 1),
                                          InvertedResidual(24, 32, 4, 2), _cbr(32, 128, 1))
            self.classifier = nn.Linear(128, 10)

        def forward(self, x):
            return self.classifier(torch.flatten(nn.functional.adaptive_avg_pool2d(self.features(x), 1), 1))

    return Net()


def crnn():
    import torch.nn as nn

    class Res(nn.Module):
        def __init__(self, c: int, k=3):
            super().__init__()
            self.body = nn.Sequential(_cbr(c, c, k), _cbr(c, c, k, act=False))
            self.act = nn.ReLU()

        def forward(self, x):
            return self.act(x + self.body(x))

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.features = nn.Sequential(
                _cbr(1, 16, 3, 2), Res(16),                                        # 16 x 48
                nn.MaxPool2d(2), _cbr(16, 24), *[Res(24) for _ in range(3)],       # 8 x 24
                nn.MaxPool2d((2, 1)), _cbr(24, 32), *[Res(32) for _ in range(4)],  # 4 x 24
                nn.MaxPool2d((2, 1)), _cbr(32, 48), *[Res(48) for _ in range(4)],  # 2 x 24
                _cbr(48, 64, (2, 1), pad=0), Res(64, (1, 3)), Res(64, (1, 3)))    # 1 x 24
            self.head = nn.Conv2d(64, len(CRNN_ALPHABET) + 1, 1)

        def forward(self, x):
            return self.head(self.features(x)).squeeze(2).transpose(1, 2)  # (N, T, classes)

    return Net()


def fold_batchnorm(module) -> None:
    """Replaces every Conv2d -> BatchNorm2d pair inside a Sequential by the folded convolution."""
    import torch.nn as nn
    from torch.nn.utils.fusion import fuse_conv_bn_eval

    for child in module.children():
        fold_batchnorm(child)
    if isinstance(module, nn.Sequential):
        items = list(module)
        for j in range(len(items) - 1):
            if isinstance(items[j], nn.Conv2d) and isinstance(items[j + 1], nn.BatchNorm2d):
                module[j] = fuse_conv_bn_eval(items[j], items[j + 1])
                module[j + 1] = nn.Identity()


# ---- training and export ------------------------------------------------------------------------

def train(net, batches, epochs: int, loss_fn, lr: float) -> list[float]:
    """AdamW with a one-cycle schedule; ``batches(epoch)`` yields (x, y) tensors."""
    import torch

    steps = sum(1 for _ in batches(-1))
    opt = torch.optim.AdamW(net.parameters(), lr, weight_decay=1e-4)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, lr, total_steps=epochs * steps)
    log = []
    for epoch in range(epochs):
        net.train()
        total = 0.0
        for xb, yb in batches(epoch):
            loss = loss_fn(net(xb), yb)
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
            total += loss.item()
        log.append(round(total / steps, 4))
        print(f"epoch {epoch}: loss {log[-1]}", flush=True)
    net.eval()
    return log


def export(net, shape: tuple[int, ...], path: Path) -> None:
    import torch

    torch.onnx.export(net, (torch.zeros(2, *shape),), str(path), dynamo=True, opset_version=18,
                      input_names=["input"], output_names=["logits"], external_data=False,
                      dynamic_shapes=({0: torch.export.Dim("batch", min=1, max=4096)},))


def ort_run(path: Path, x: np.ndarray) -> np.ndarray:
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return np.concatenate([session.run(None, {"input": x[i:i + 128]})[0] for i in range(0, len(x), 128)])


def _loader(x: np.ndarray, y: np.ndarray, batch: int):
    import torch

    def batches(epoch: int):
        order = np.random.default_rng(1000 + epoch).permutation(len(x)) if epoch >= 0 else np.arange(len(x))
        for i in range(0, len(x), batch):
            idx = order[i:i + batch]
            yield torch.from_numpy(x[idx]), torch.from_numpy(y[idx])
    return batches


def build_mobilenet(out: Path, epochs: int) -> dict:
    import torch

    xtr, xte, ytr, yte = _digits()
    rng = np.random.default_rng(0)
    train_x = digit_scenes(xtr, 6, rng)
    train_y = np.tile(ytr, 6)
    eval_x, eval_y = digit_scenes(xte, 2, rng), np.tile(yte, 2)
    calib = digit_scenes(xtr[rng.permutation(len(xtr))[:256]], 1, rng)
    net = mobilenet()
    log = train(net, _loader(train_x, train_y, 64), epochs, torch.nn.functional.cross_entropy, 4e-3)
    fold_batchnorm(net)
    export(net, (3, 32, 32), out / "model.onnx")
    logits = ort_run(out / "model.onnx", eval_x)
    np.savez_compressed(out / "calib.npz", input=calib)
    np.savez_compressed(out / "eval.npz", input=eval_x, label=eval_y)
    return {"top1": float((logits.argmax(-1) == eval_y).mean()), "train_loss_per_epoch": log,
            "n_train": len(train_x), "n_eval": len(eval_x), "n_calib": len(calib)}


def build_crnn(out: Path, epochs: int) -> dict:
    import onnx
    import torch

    rng = np.random.default_rng(1)
    train_x, _, train_cols = text_strips(8000, rng)
    eval_x, eval_y, _ = text_strips(800, rng)
    calib, _, _ = text_strips(256, rng)
    net = crnn()

    def loss_fn(logits, cols):  # per-column cross-entropy: a fast stand-in for CTC on aligned strips
        return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), cols.reshape(-1))

    log = train(net, _loader(train_x, train_cols, 32), epochs, loss_fn, 3e-3)
    fold_batchnorm(net)
    export(net, (1, 32, 96), out / "model.onnx")
    model = onnx.load(str(out / "model.onnx"))
    onnx.save(export_forms.constants(model), str(out / "model.onnx"))  # weights as Constant nodes
    logits = ort_run(out / "model.onnx", eval_x)
    np.savez_compressed(out / "calib.npz", input=calib)
    np.savez_compressed(out / "eval.npz", input=eval_x, label=eval_y)
    return {"exact": float(ctc_exact(logits, eval_y).mean()), "train_loss_per_epoch": log,
            "n_train": len(train_x), "n_eval": len(eval_x), "n_calib": len(calib)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("name", choices=("mobilenet_digits", "crnn_text"))
    parser.add_argument("--epochs", type=int,
                        help="Training epochs (default: 8 for mobilenet_digits, 5 for crnn_text).")
    args = parser.parse_args()
    import torch

    torch.manual_seed(0)
    torch.set_num_threads(1)  # on 2 shared cores one thread trains several times faster than two
    out = ZOO / args.name
    out.mkdir(parents=True, exist_ok=True)
    start = time.time()
    if args.name == "mobilenet_digits":
        metrics = build_mobilenet(out, args.epochs or 8)
    else:
        metrics = build_crnn(out, args.epochs or 5)
    metrics["build_s"] = round(time.time() - start, 1)
    (out / "metrics_fp32.json").write_text(json.dumps(metrics, indent=1, sort_keys=True) + "\n")
    print(metrics)
    return 0


if __name__ == "__main__":
    sys.exit(main())
