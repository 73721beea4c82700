#!/usr/bin/env bash
# Recreate the NNCF venv: NNCF 3.4 (ONNX backend, CPU) beside the ONNX Runtime quantdbg's venv runs,
# used by benchmarks/auto.py to run nncf.quantize_with_accuracy_control next to `quantdbg auto`.
#
# Why a separate venv: NNCF pins numpy < 2.5, networkx <= 3.6.1 and pydot <= 4.0.1, and its ONNX
# backend wants its own onnx/onnxruntime; quantdbg's venv is never touched. The ONNX Runtime and
# onnx versions are the ones quantdbg's venv resolves to today, so both tools run the same
# inference engine and the wall times compare the tools, not two runtimes.
#
# Why --no-deps: NNCF's only requirement left out is openvino-telemetry (usage statistics); without
# it NNCF falls back to its no-op telemetry stub, so nothing ever tries to reach the network.
# Everything else NNCF 3.4.0 requires is listed here with a pin.
set -euo pipefail
VENV=${NNCF_VENV:-/work/nncf_venv}
PY=${PYTHON:-python3}
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
PIP="$VENV/bin/pip"
"$PIP" install -q -U pip
# 1. NNCF 3.4.0's requirements (METADATA Requires-Dist) minus openvino-telemetry, plus its ONNX
#    backend (onnx + onnxruntime, CPU wheel).
"$PIP" install -q "onnx==1.23.2" "onnxruntime==1.31.1" "numpy==2.4.6" "networkx==3.6.1" \
  "ninja==1.13.0" "packaging==26.4" "psutil==7.2.2" "pydot==4.0.1" "rich==15.0.0" \
  "safetensors==0.8.0" "scikit-learn==1.9.1" "scipy==1.17.1" "tabulate==0.10.0"
# 2. NNCF itself, without letting pip add the telemetry package.
"$PIP" install -q --no-deps "nncf==3.4.0"
# 3. Check: the ONNX accuracy-control path imports, the telemetry is the stub, CPU provider only.
"$VENV/bin/python" - <<'PY'
import nncf
import onnxruntime as ort
from nncf.telemetry.wrapper import NNCFTelemetryStub, telemetry
from nncf.onnx.quantization.quantize_model import quantize_with_accuracy_control_impl  # noqa: F401

assert nncf.__version__ == "3.4.0", nncf.__version__
assert isinstance(telemetry, NNCFTelemetryStub), type(telemetry)
assert "CPUExecutionProvider" in ort.get_available_providers()
print("nncf venv ok: nncf", nncf.__version__, "onnxruntime", ort.__version__)
PY
