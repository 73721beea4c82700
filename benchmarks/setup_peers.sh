#!/usr/bin/env bash
# Recreate the peers venv: CPU ONNX Runtime 1.24 + NVIDIA ModelOpt 0.47 (ONNX path), used by
# benchmarks/calibration.py and benchmarks/placement.py to run the peer quantizers.
#
# Why a separate venv and --no-deps: nvidia-modelopt 0.47's [onnx] extra requires
# onnxruntime-gpu~=1.24.2 on x86-64 Linux, which clashes with the CPU `onnxruntime` wheel (both
# install the `onnxruntime` package). The CPU wheel of the same 1.24 line does everything the
# int8 max/entropy calibration needs, so ModelOpt is installed without its dependencies and its
# real ones (the [onnx] extra minus onnxruntime-gpu and cupy-cuda12x, which are GPU-only) are
# listed by hand. torch is a hard import of modelopt.onnx.quantization (qdq_utils); the CPU
# build is pinned. The project's own venv is never touched.
set -euo pipefail
VENV=${PEERS_VENV:-/work/peers_venv}
PY=${PYTHON:-python3}
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
PIP="$VENV/bin/pip"
"$PIP" install -q -U pip
# 1. CPU ONNX Runtime of the line ModelOpt 0.47 pins, plus ModelOpt's non-GPU dependencies.
"$PIP" install -q "onnxruntime==1.24.4" "onnx~=1.21.0" "onnx-graphsurgeon>=0.6.1" \
  "onnxconverter-common~=1.16.0" ml_dtypes lief cppimport onnxscript "onnxslim>=0.1.76" \
  "polygraphy>=0.53.4" ninja numpy "nvidia-ml-py>=12" packaging "setuptools>=80" tqdm \
  "PyYAML>=6.0" "omegaconf>=2.3.0" "pulp<4.0" "pydantic>=2.0" regex rich safetensors scipy psutil
# 2. ModelOpt itself, without letting pip pull onnxruntime-gpu.
"$PIP" install -q --no-deps "nvidia-modelopt==0.47.0"
# 3. torch (CPU): imported by modelopt.onnx.quantization.
"$PIP" install -q "torch==2.13.0"
# 4. Check: the ONNX quantization path imports and the CPU provider is there.
"$VENV/bin/python" - <<'PY'
import modelopt.onnx.quantization  # noqa: F401
import onnxruntime as ort
assert ort.__version__.startswith("1.24."), ort.__version__
assert "CPUExecutionProvider" in ort.get_available_providers()
print("peers venv ok: onnxruntime", ort.__version__)
PY
