"""``quantdbg analyze`` and ``quantdbg fallback``: outputs on success, exact one-line errors otherwise."""
from __future__ import annotations

import json
import shlex
import sys

import models_sensitivity as ms
import numpy as np
import onnx
import pytest
from tool_grammars import poly_shapes, polygraphy, run, trtexec, trtexec_shapes

from quantdbg.cli import main
from quantdbg.fallback import FallbackPlan
from quantdbg.sensitivity import SensitivityReport

PY = shlex.quote(sys.executable)
# Task metric: minus the number of DequantizeLinear nodes (each layer of mlp4 has two).
COUNT_DQ = (f"{PY} -c \"import sys, onnx; m = onnx.load(sys.argv[1]); "
            f"print(-sum(n.op_type == 'DequantizeLinear' for n in m.graph.node))\" {{model}}")


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """FP32 mlp4, its calibration/eval data, and a Q/DQ version with fc2's input range 100x too small."""
    folder = tmp_path_factory.mktemp("cli")
    rng = np.random.default_rng(0)
    model = ms.mlp4()
    feeds = ms.feeds_for(model, rng)
    onnx.save(model, str(folder / "fp32.onnx"))
    ms.quantize_by_hand(model, feeds, {"act1": 0.01}).save(folder / "qdq.onnx")
    x = np.concatenate([f["x"] for f in feeds])
    np.savez(folder / "calib.npz", x=x)
    np.savez(folder / "eval.npz", x=x, label=np.argmax(x, axis=1))
    return folder


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_analyze_fp32_model(files, capsys, tmp_path):
    out = tmp_path / "result.json"
    code, stdout, _ = _run(capsys, "analyze", files / "fp32.onnx", "--data", files / "calib.npz", "--eval",
                           files / "eval.npz", "--method", "minmax", "--mode", "isolated", "--labels",
                           "label", "--out", out)
    assert code == 0
    report = SensitivityReport.read(out)
    assert sorted(report.ranking) == ["fc0", "fc1", "fc2", "fc3"]
    assert report.metric == "accuracy" and report.mode == "isolated"
    assert stdout.splitlines()[0].startswith("isolated sensitivity of 4 layers")
    assert not (tmp_path / "result.json.partial").exists()


def test_analyze_qdq_model_with_its_fp32_original(files, capsys, tmp_path):
    out = tmp_path / "result.json"
    code, stdout, _ = _run(capsys, "analyze", files / "qdq.onnx", "--fp32", files / "fp32.onnx", "--eval",
                           files / "eval.npz", "--out", out)
    assert code == 0
    assert SensitivityReport.read(out).ranking[0] == "fc2"
    assert stdout.splitlines()[1].split()[:2] == ["1", "fc2"]


def test_fallback_writes_the_mixed_model_and_plan(files, capsys, tmp_path):
    mixed, plan_path = tmp_path / "mixed.onnx", tmp_path / "plan.json"
    code, stdout, _ = _run(capsys, "fallback", files / "qdq.onnx", "--fp32", files / "fp32.onnx", "--eval",
                           files / "eval.npz", "--min-sqnr", "30", "--out", mixed, "--plan", plan_path)
    assert code == 0
    plan = FallbackPlan.from_dict(json.loads(plan_path.read_text()))
    assert plan.status == "met" and plan.exclude == ("fc2",)
    consumers = {n.name: n for n in onnx.load(str(mixed)).graph.node}
    producers = {o: n.op_type for n in consumers.values() for o in n.output}
    assert "DequantizeLinear" not in [producers.get(t) for t in consumers["fc2"].input]
    assert stdout.startswith("met: 1 of 4 layer(s) kept out of INT8 in fp16, value ")
    build = json.loads(plan_path.read_text())["tensorrt"]["build"]
    commands = build["commands"]
    assert stdout.splitlines()[1:] == [
        "  fc2", "trtexec (strongly typed):", f"  {commands['trtexec']}",
        "trtexec (weakly typed, excluded layers pinned):", f"  {commands['trtexec_weakly_typed']}",
        "polygraphy convert:", f"  {commands['polygraphy_convert']}",
        "polygraphy run (TensorRT vs ONNX Runtime):", f"  {commands['polygraphy_run']}",
        "ModelOpt (same layers excluded):", f"  {commands['modelopt']}"]
    # ModelOpt quantizes the FP32 original itself, leaving out the same node.
    assert shlex.split(commands["modelopt"])[3:5] == ["--onnx_path", str(files / "fp32.onnx")]
    assert shlex.split(commands["modelopt"])[-4:-2] == ["--nodes_to_exclude", "fc2"]
    assert build["spec"]["exclude"] == ["fc2"] and build["spec"]["exclude_precision"] == "fp16"
    # Any batch up to --batch-size (default 32), whatever the 12 samples of eval.npz made the last batch.
    assert build["spec"]["config"]["shapes"]["x"] == {"min": [1, 16], "opt": [32, 16], "max": [32, 16]}
    assert f"--onnx={mixed}" in build["commands"]["trtexec"]
    assert "--stronglyTyped" in build["commands"]["trtexec"]


def test_fallback_with_an_evaluation_command(files, capsys, tmp_path):
    plan_path = tmp_path / "plan.json"
    code, _, err = _run(capsys, "fallback", files / "qdq.onnx", "--fp32", files / "fp32.onnx", "--eval",
                        files / "eval.npz", "--evaluate", COUNT_DQ, "--min-metric", "-4", "--precision",
                        "fp32", "--out", tmp_path / "mixed.onnx", "--plan", plan_path)
    assert code == 0, err
    plan = json.loads(plan_path.read_text())
    assert len(plan["exclude"]) == 2 and plan["value"] == -4.0 and plan["precision"] == "fp32"


def test_unreachable_target(files, capsys, tmp_path):
    plan_path, mixed = tmp_path / "plan.json", tmp_path / "mixed.onnx"
    code, _, err = _run(capsys, "fallback", files / "qdq.onnx", "--fp32", files / "fp32.onnx", "--eval",
                        files / "eval.npz", "--evaluate", f"{PY} -c 'print(0.1)' {{model}}", "--min-metric",
                        "0.5", "--out", mixed, "--plan", plan_path)
    assert code == 2
    assert err == ("quantdbg fallback: error: Target metric >= 0.5 is unreachable: even all 4 ranked nodes "
                   "out of INT8 miss it; best achieved 0.1 with 1 node(s) out of INT8. Plan written to "
                   f"{plan_path}.\n")
    assert json.loads(plan_path.read_text())["status"] == "unreachable"
    assert not mixed.exists()


def _error(capsys, *argv: str) -> str:
    code, _, err = _run(capsys, *argv)
    assert code == 2
    assert err.count("\n") == 1
    return err


def test_error_messages(files, capsys, tmp_path):
    qdq, fp32, evals, out = files / "qdq.onnx", files / "fp32.onnx", files / "eval.npz", tmp_path / "r.json"
    assert _error(capsys, "analyze", qdq, "--eval", evals, "--out", out) == (
        f"quantdbg analyze: error: MODEL '{qdq}' is already quantized (16 Q/DQ node(s)); give its FP32 "
        "original with --fp32 FP32.onnx.\n")
    assert _error(capsys, "analyze", fp32, "--fp32", fp32, "--eval", evals, "--out", out) == (
        f"quantdbg analyze: error: --fp32 is only for a Q/DQ MODEL, but '{fp32}' holds no Q/DQ nodes; "
        "drop --fp32.\n")
    assert _error(capsys, "analyze", fp32, "--eval", evals, "--out", out) == (
        f"quantdbg analyze: error: MODEL '{fp32}' is FP32: give calibration data with --data CALIB.npz to "
        "quantize it.\n")
    assert _error(capsys, "analyze", qdq, "--fp32", fp32, "--eval", evals, "--evaluate", "python e.py",
                  "--out", out) == (
        "quantdbg analyze: error: The evaluation command 'python e.py' does not contain {model}; put {model} "
        "where the model path goes, e.g. 'python eval.py {model}'.\n")
    assert _error(capsys, "analyze", qdq, "--fp32", fp32, "--eval", evals, "--lower-is-better",
                  "--out", out) == (
        "quantdbg analyze: error: --lower-is-better describes the --evaluate command's metric; add "
        "--evaluate CMD.\n")
    assert _error(capsys, "analyze", qdq, "--fp32", fp32, "--eval", evals, "--out",
                  tmp_path / "missing" / "r.json") == (
        f"quantdbg analyze: error: --out '{tmp_path / 'missing' / 'r.json'}': folder "
        f"'{tmp_path / 'missing'}' does not exist.\n")
    assert _error(capsys, "fallback", qdq, "--fp32", fp32, "--eval", evals, "--evaluate", "x {model}",
                  "--min-sqnr", "20", "--out", tmp_path / "m.onnx", "--plan", out) == (
        "quantdbg fallback: error: --min-sqnr judges the output SQNR; --evaluate/--labels go with "
        "--min-metric or --max-rel-loss.\n")
    assert _error(capsys, "fallback", qdq, "--fp32", fp32, "--eval", evals, "--max-rel-loss", "-1",
                  "--out", tmp_path / "m.onnx", "--plan", out) == (
        "quantdbg fallback: error: A relative-loss bound is a percentage >= 0, got -1.0.\n")
    assert _error(capsys, "analyze", qdq, "--fp32", fp32, "--eval", tmp_path / "nope.npz", "--out", out) == (
        f"quantdbg analyze: error: Data file '{tmp_path / 'nope.npz'}' does not exist.\n")


def test_layer_choices_are_for_an_fp32_model_and_the_cli_speaks_its_own_flags(files, capsys, tmp_path):
    qdq, fp32, evals, out = files / "qdq.onnx", files / "fp32.onnx", files / "eval.npz", tmp_path / "r.json"
    assert _error(capsys, "analyze", qdq, "--fp32", fp32, "--eval", evals, "--nodes-to-exclude", "fc2",
                  "-o", out) == (
        f"quantdbg analyze: error: MODEL '{qdq}' is already quantized: --exclude, --op-types and "
        "--op-types-to-exclude choose the layers of an FP32 MODEL; drop them.\n")
    err = _error(capsys, "calibrate", qdq, "--data", evals, "-o", tmp_path / "int8.onnx")
    assert "is already quantized" in err and "MODEL --fp32 FP32.onnx" in err and "allow_quantized" not in err


def _model_shape(path) -> list[int | None]:  # noqa: ANN001
    (graph_input,) = onnx.load(str(path)).graph.input
    return [d.dim_value if d.HasField("dim_value") else None for d in graph_input.type.tensor_type.shape.dim]


@pytest.mark.parametrize("options, batch", [
    (("--batch-size", "5"), (1, 5, 5)),  # 12 evaluation samples: the last batch (2) sets nothing
    (("--profile", "2,4,8"), (2, 4, 8)),
    (("--profile", "x:1x16,3x16,6x16"), (1, 3, 6)),
])
def test_fallback_build_profile_is_one_rule_and_can_be_overridden(files, capsys, tmp_path, options, batch):
    plan_path = tmp_path / "plan.json"
    code, _, err = _run(capsys, "fallback", files / "qdq.onnx", "--fp32", files / "fp32.onnx", "--eval",
                        files / "eval.npz", "--min-sqnr", "30", "--out", tmp_path / "m.onnx", "--plan",
                        plan_path, *options)
    assert code == 0, err
    commands = FallbackPlan.read(plan_path).commands
    parsed = run(commands.trtexec, ["trtexec"], trtexec())
    shape = _model_shape(files / "fp32.onnx")
    assert shape[0] is None and None not in shape[1:]  # only the batch is dynamic
    for which, size in zip(("min", "opt", "max"), batch, strict=True):
        assert trtexec_shapes(getattr(parsed, f"{which}Shapes")) == {"x": (size, *shape[1:])}
    convert = run(commands.polygraphy_convert, ["polygraphy", "convert"], polygraphy("convert"))
    assert [poly_shapes(convert.trt_min_shapes[0]), poly_shapes(convert.trt_max_shapes[0])] == [
        {"x": (batch[0], *shape[1:])}, {"x": (batch[2], *shape[1:])}]


@pytest.mark.parametrize("profile, message", [
    ("4,2,8", "--profile '4,2,8': the batch range needs 1 <= MIN <= OPT <= MAX."),
    ("y:1,2,3", "--profile 'y:1,2,3': No input named 'y' in the model."),
    ("x:1x15,2x16,4x16", "--profile 'x:1x15,2x16,4x16': The range for input 'x' sets axis 1 to 15..16, "
                         "but that axis is fixed at 16."),
    ("1,2", "--profile '1,2': expected --profile MIN,OPT,MAX or --profile INPUT:MIN,OPT,MAX, each of MIN, "
            "OPT, MAX a batch size (8) or a shape (8x128)."),
])
def test_a_bad_profile_is_one_line_with_status_2(files, capsys, tmp_path, profile, message):
    code, _, err = _run(capsys, "fallback", files / "qdq.onnx", "--fp32", files / "fp32.onnx", "--eval",
                        files / "eval.npz", "--min-sqnr", "30", "--out", tmp_path / "m.onnx", "--plan",
                        tmp_path / "p.json", "--profile", profile)
    assert (code, err) == (2, f"quantdbg fallback: error: {message}\n")
    assert not (tmp_path / "p.json").exists()
