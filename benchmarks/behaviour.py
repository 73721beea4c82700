"""What the library decides on the zoo, in one canonical JSON, to show a refactoring changed nothing.

For each model (the embedded digits CNN and the zoo's digits CNN, MiniLM-L6 and Silero VAD) it
records what a user gets back, through the documented top-level API only (so the same script runs
on the code before and after a restructuring):

* per calibrator (minmax, entropy, percentile, mse): the Q/DQ model's SHA-256, the TensorRT
  calibration cache text and every scale;
* on the entropy model: the local sensitivity report (and the isolated one on the small models),
  the fallback plan of an SQNR target and the mixed model's SHA-256, and the lint report;
* on the embedded model: the doctor report.

Wall times (every ``seconds`` field) are dropped, scratch paths replaced by ``<work>`` and the
checkout's own path by ``<repo>``; nothing else is touched. Two runs are then compared byte for byte::

    python benchmarks/behaviour.py --out /tmp/before.json          # on the old commit
    python benchmarks/behaviour.py --out /tmp/after.json           # on the new one
    python benchmarks/behaviour.py --compare /tmp/before.json /tmp/after.json
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _zoo_tasks import ZOO, load_task  # noqa: E402

import quantdbg  # noqa: E402
import quantdbg.qdq  # noqa: E402
from quantdbg.sensitivity import SensitivityConfig, VariantEvaluator  # noqa: E402

METHODS = ("minmax", "entropy", "percentile", "mse")
MIN_SQNR = {"embedded_digits": 40.0, "digits_cnn": 40.0, "minilm_l6_v2_text": 30.0, "silero_vad_16k": 30.0}
ISOLATED = {"embedded_digits", "digits_cnn"}


REPO = str(Path(__file__).resolve().parents[1])


def _canonical(value: Any, work: str) -> Any:
    """JSON data with wall times dropped and scratch and checkout paths made neutral."""
    if isinstance(value, dict):
        return {k: _canonical(v, work) for k, v in value.items() if k != "seconds"}
    if isinstance(value, (list, tuple)):
        return [_canonical(v, work) for v in value]
    if isinstance(value, str):
        return value.replace(work, "<work>").replace(REPO, "<repo>")
    return value


def _api(name: str) -> Any:
    """A top-level API function; before the restructuring a submodule of the same name shadowed it."""
    value = getattr(quantdbg, name)
    return getattr(value, name) if isinstance(value, ModuleType) else value


def _sha(model: Any) -> str:
    return hashlib.sha256(model.SerializeToString()).hexdigest()


def _scales(qmodel: Any, work: Path) -> dict[str, Any]:
    cache, scales = work / "calib.cache", work / "scales.json"
    quantdbg.write_trt_cache(qmodel.calibration, cache)
    quantdbg.qdq.write_scales_json(qmodel, scales)
    return {"model_sha256": _sha(qmodel.model), "cache": cache.read_text(),
            "scales": json.loads(scales.read_text())}


def _model_facts(name: str, model: Any, calib: Any, evals: Any, work: Path) -> dict[str, Any]:
    facts: dict[str, Any] = {}
    quantized = {}
    for method in METHODS:
        quantized[method] = quantdbg.quantize(model, calib, quantdbg.CalibConfig(method=method))
        facts[method] = _scales(quantized[method], work)
    qmodel = quantized["entropy"]
    local = quantdbg.analyze_sensitivity(model, qmodel, evals)
    facts["sensitivity_local"] = local.to_dict()
    if name in ISOLATED:
        isolated = SensitivityConfig(mode="isolated", evidence=False)
        facts["sensitivity_isolated"] = quantdbg.analyze_sensitivity(model, qmodel, evals, isolated).to_dict()
    with VariantEvaluator(model, qmodel, evals) as evaluator:
        target = quantdbg.FallbackTarget.min_sqnr(MIN_SQNR[name])
        result = quantdbg.auto_fallback(evaluator, target, report=local)
    facts["fallback_plan"] = result.plan.to_dict()
    facts["mixed_sha256"] = None if result.mixed is None else _sha(result.mixed.model)
    facts["lint"] = _api("lint")(qmodel.model).to_dict()
    return facts


def _tasks() -> dict[str, Callable[[Path], tuple[Any, Any, Any]]]:
    def embedded(_: Path) -> tuple[Any, Any, Any]:
        emb = quantdbg.load_embedded()
        return str(emb.model_path), emb.calib, emb.eval_inputs

    def zoo(name: str) -> Callable[[Path], tuple[Any, Any, Any]]:
        def load(work: Path) -> tuple[Any, Any, Any]:
            task = load_task(name, work / "zoo")
            return str(task.model), task.calib, task.eval
        return load

    tasks: dict[str, Callable[[Path], tuple[Any, Any, Any]]] = {"embedded_digits": embedded}
    for name in ("digits_cnn", "minilm_l6_v2_text", "silero_vad_16k"):
        if (ZOO / name / "model.onnx").is_file():
            tasks[name] = zoo(name)
    return tasks


def snapshot(only: list[str] | None) -> dict[str, Any]:
    """Every model's facts, keyed by model name."""
    out: dict[str, Any] = {}
    for name, load in _tasks().items():
        if only and name not in only:
            continue
        with tempfile.TemporaryDirectory(prefix="quantdbg-behaviour-") as tmp:
            work = Path(tmp)
            model, calib, evals = load(work)
            print(f"{name} ...", file=sys.stderr, flush=True)
            facts = _model_facts(name, model, calib, evals, work)
            if name == "embedded_digits":
                facts["doctor"] = quantdbg.diagnose(model, calib, evals).to_dict()
            out[name] = _canonical(facts, tmp)
    return out


def compare(before: Path, after: Path) -> int:
    """Prints the first differing key per model; returns 1 when the files differ."""
    a, b = before.read_bytes(), after.read_bytes()
    if a == b:
        digest = hashlib.sha256(a).hexdigest()[:16]
        print(f"identical: {before} and {after} ({len(a)} bytes, sha256 {digest})")
        return 0
    old, new = json.loads(a), json.loads(b)
    for name in sorted(set(old) | set(new)):
        for key in sorted(set(old.get(name, {})) | set(new.get(name, {}))):
            if old.get(name, {}).get(key) != new.get(name, {}).get(key):
                print(f"differs: {name} / {key}")
    return 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="Write the snapshot here.")
    parser.add_argument("--models", nargs="+", help="Only these models.")
    parser.add_argument("--compare", nargs=2, type=Path, metavar=("BEFORE", "AFTER"))
    args = parser.parse_args()
    if args.compare:
        return compare(*args.compare)
    if args.out is None:
        parser.error("give --out FILE or --compare BEFORE AFTER")
    warnings.simplefilter("ignore")
    np.seterr(all="ignore")
    data = snapshot(args.models)
    args.out.write_text(json.dumps(data, indent=1, sort_keys=True, allow_nan=True) + "\n")
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
