"""Helpers shared by the zoo examples: where the zoo is, scoring with a builder, printing a table.

The zoo models are built offline by ``../shared/models`` (real weights and data from PyPI wheels)
into ``$QDBG_MODELS`` (default ``/tmp/qdbg_models``); each builder scores any variant of its model
with ``--eval X.onnx`` in the builders' own environment (``$QDBG_VENV``, default ``/tmp/qdbg_venv``).
"""
from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ZOO = Path(os.environ.get("QDBG_MODELS", "/tmp/qdbg_models"))
BUILDERS = Path(os.environ.get("QDBG_BUILDERS", REPO.parent / "shared" / "models"))
BUILDER_PYTHON = Path(os.environ.get("QDBG_VENV", "/tmp/qdbg_venv")) / "bin" / "python"


def zoo_folder(name: str) -> Path:
    """The zoo model's folder; exits with status 0 and a message when it has not been built."""
    folder = ZOO / name
    if not (folder / "model.onnx").is_file():
        print(zoo_missing_message(name, os.environ.get("QDBG_MODELS")))
        sys.exit(0)
    return folder


def zoo_missing_message(name: str, zoo_env: str | None) -> str:
    """What an example prints when its zoo model is absent: what is missing and how to get it, naming
    only paths the user chose (the builders live outside this repository)."""
    where = (f"$QDBG_MODELS ({zoo_env}) has no {name}/model.onnx" if zoo_env else
             f"$QDBG_MODELS is not set, and the default zoo folder has no {name}/model.onnx")
    return (f"skipped: zoo model {name!r} is not available: {where}. Build the model zoo and set QDBG_MODELS "
            "to its folder (README.md, 'Benchmarks and the model zoo'); examples/digits_cnn.py runs on the "
            "model shipped inside quantdbg without it.")


def builder_eval(builder: str, model: Path) -> dict[str, float]:
    """Scores ``model`` with the builder's own ``--eval`` (a separate process and environment)."""
    script = BUILDERS / builder
    if not script.is_file():
        raise SystemExit(f"error: the zoo's builder {builder!r} is not found; set QDBG_BUILDERS to the "
                         "folder holding the zoo's builder scripts (README.md, 'Benchmarks and the model "
                         "zoo').")
    python = str(BUILDER_PYTHON) if BUILDER_PYTHON.is_file() else sys.executable
    done = subprocess.run([python, str(script), "--eval", str(model)], capture_output=True,
                          text=True, check=True)
    last = done.stdout.strip().splitlines()[-1]
    last = re.sub(r"np\.float\d+\(([^()]*)\)", r"\1", last)  # numpy 2 reprs
    last = re.sub(r"\bnan\b", "None", last)
    return {k: (float("nan") if v is None else float(v)) for k, v in ast.literal_eval(last).items()}


def print_table(title: str, columns: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    """Prints a fixed-width table (floats to 4 decimals)."""
    cells = [[f"{v:.4f}" if isinstance(v, float) else str(v) for v in row] for row in rows]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(columns)]
    print(title)
    for row in [list(columns), *cells]:
        print("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip())
