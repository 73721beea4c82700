#!/usr/bin/env bash
# Type-checks the TensorRT backend against tensorrt-stubs (the TensorRT 10.13 Python API).
#
# TensorRT itself cannot be installed on CPU-only CI machines, so this is the check that the backend
# calls the real API with the right names and argument types. The stubs package declares a dependency
# on `tensorrt` (which would pull NVIDIA's installer), hence --no-deps.
#
# Usage: bash .ci/mypy_trt.sh   (with the project venv's bin/ first on PATH)
set -euo pipefail
cd "$(dirname "$0")/.."

STUBS_VERSION="10.13.0.35.1"
if ! python -c "import importlib.metadata as m, sys; sys.exit(m.version('tensorrt-stubs') != '$STUBS_VERSION')" 2>/dev/null; then
    python -m pip install --quiet --no-deps "tensorrt-stubs==$STUBS_VERSION"
fi

# tensorrt-stubs 10.13.0.35.1, as installed, is invisible to mypy: its tensorrt/ and tensorrt_bindings/
# folders hold .pyi files but no py.typed marker, so mypy treats `tensorrt` as untyped (everything
# Any) and a check passes vacuously. Its generated stubs also have a few syntax errors (a parameter
# named `in`, a required parameter after defaulted ones) and import the runtime-only `tensorrt_libs`,
# which stop mypy. So: copy the two folders to a scratch directory, repair those lines, and put that
# directory on MYPYPATH (no marker needed there).
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
python - "$WORK/stubs" <<'PY'
import importlib.metadata as md
import re
import shutil
import sys
from pathlib import Path

dest = Path(sys.argv[1])
dist = md.distribution("tensorrt-stubs")
for package in ("tensorrt", "tensorrt_bindings"):
    init = next(f for f in dist.files if str(f).replace("\\", "/") == f"{package}/__init__.pyi")
    shutil.copytree(Path(dist.locate_file(init)).parent, dest / package,
                    ignore=shutil.ignore_patterns("__pycache__"))
for stub in dest.rglob("*.pyi"):
    fixed = []
    for line in stub.read_text(encoding="utf-8").splitlines():
        if line.strip() == "import tensorrt_libs as tensorrt_libs":
            continue
        if line.lstrip().startswith("def "):
            line = re.sub(r"([(,] ?)in: ", r"\1in_: ", line)
            line = line.replace("power: Weights = None, channel_axis: int)",
                                "power: Weights = None, channel_axis: int = ...)")
        # The module-level alias `bool: DataType` (trt.bool) shadows the builtin in every `-> bool`
        # annotation, which turns those returns into an always-true object; name the builtin.
        if not line.startswith("bool:"):
            line = re.sub(r"(?<![\w.])bool(?!\w)", "builtins.bool", line)
        fixed.append(line)
    future = [i for i, line in enumerate(fixed) if line.startswith("from __future__")]
    fixed.insert(future[-1] + 1 if future else 0, "import builtins")
    stub.write_text("\n".join(fixed) + "\n", encoding="utf-8")
PY

# Errors inside the generated stubs are theirs, not ours.
cat > "$WORK/mypy.ini" <<'INI'
[mypy]
[mypy-tensorrt.*]
ignore_errors = True
[mypy-tensorrt_bindings.*]
ignore_errors = True
INI

# Refuse the vacuous pass: the stubs must be what mypy resolves `tensorrt` to.
printf 'import tensorrt as trt\nreveal_type(trt.Builder.build_serialized_network)\n' > "$WORK/probe.py"
PROBE_OUT="$(MYPYPATH="$WORK/stubs" python -m mypy --config-file "$WORK/mypy.ini" --no-incremental \
    --cache-dir "$WORK/cache" "$WORK/probe.py" || true)"
if [[ "$PROBE_OUT" != *"-> tensorrt_bindings.tensorrt.IHostMemory"* ]]; then
    echo "mypy does not resolve tensorrt to tensorrt-stubs; refusing a vacuous check." >&2
    exit 1
fi

# --strict on the backend module only; the quantdbg modules it imports are followed silently (the
# project's own mypy run checks them). cuda-python ships no stubs, so its calls are typed Any.
MYPYPATH="$WORK/stubs" python -m mypy --config-file "$WORK/mypy.ini" --strict --warn-unreachable --no-incremental \
    --cache-dir "$WORK/cache" --follow-imports=silent --ignore-missing-imports --python-version 3.10 \
    src/quantdbg/backends/tensorrt/
