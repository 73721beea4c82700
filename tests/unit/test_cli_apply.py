"""``quantdbg apply``: the model of an ``auto`` result or a ``fallback`` plan re-created byte for byte, the
nodes a re-export renamed named in one error, and the evaluation gate's exit status (0 met, 1 missed)."""
from __future__ import annotations

import json

import models_auto as ma
import numpy as np
import onnx
import pytest
from tool_grammars import modelopt, run, trtexec

from quantdbg.cli import main
from quantdbg.errors import ConfigError, ModelError
from quantdbg.fallback import FallbackPlan
from quantdbg.pipeline import apply_recipe


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """The planted CNN (only keeping ``conv2`` out of INT8 meets 30 dB), its data and a scoring script."""
    rng = np.random.default_rng(1)
    return ma.write_task_files(tmp_path_factory.mktemp("apply"), ma.planted_cnn(), ma.cnn_inputs(rng),
                               ma.cnn_inputs(rng))


def _run(capsys, *argv) -> tuple[int, str, str]:  # noqa: ANN001
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def fallback_run(files, tmp_path_factory):
    """``quantdbg fallback`` on the FP32 model: the mixed model and its plan."""
    folder = tmp_path_factory.mktemp("fallback")
    code = main([str(a) for a in ("fallback", files / "fp32.onnx", "--data", files / "calib.npz", "--eval",
                                  files / "eval.npz", "--min-sqnr", "30", "--precision", "fp32", "--out",
                                  folder / "mixed.onnx", "--plan", folder / "plan.json", "--no-progress")])
    assert code == 0
    return folder


def test_a_fallback_plan_re_creates_its_model_byte_for_byte(files, fallback_run, capsys, tmp_path):
    plan = FallbackPlan.read(fallback_run / "plan.json")
    assert plan.exclude == (ma.PLANTED,) and plan.calib is not None and plan.quant is not None
    out = tmp_path / "again.onnx"
    code, stdout, err = _run(capsys, "apply", fallback_run / "plan.json", files / "fp32.onnx", "--data",
                             files / "calib.npz", "-o", out, "--batch-size", "7")
    assert code == 0, err
    assert out.read_bytes() == (fallback_run / "mixed.onnx").read_bytes()
    lines = stdout.splitlines()
    assert lines[:2] == [f"wrote {out}: 3 layer(s) in INT8, 1 kept out in fp32", f"  {ma.PLANTED}"]
    command = lines[lines.index("trtexec (strongly typed):") + 1].strip()
    assert run(command, ["trtexec"], trtexec()).onnx == str(out)
    mo = lines[lines.index("ModelOpt (same layers excluded):") + 1].strip()
    parsed = run(mo, ["python", "-m", "modelopt.onnx.quantization"], modelopt())
    assert parsed.nodes_to_exclude == [ma.PLANTED] and parsed.onnx_path == str(files / "fp32.onnx")
    # The Python twin takes the plan itself as well as its file.
    again = apply_recipe(files / "fp32.onnx", files / "calib.npz", plan)
    assert again.model.SerializeToString() == onnx.load(str(out)).SerializeToString()


def test_an_auto_result_re_creates_its_model_byte_for_byte(files, capsys, tmp_path):
    code, _, err = _run(capsys, "auto", files / "fp32.onnx", "--data", files / "calib.npz", "--eval",
                        files / "eval.npz", "--metric", "sqnr", "--min-metric", "30", "--precision", "fp32",
                        "--out", tmp_path / "auto.onnx", "--plan", tmp_path / "auto.json", "--no-progress")
    assert code == 0, err
    code, _, err = _run(capsys, "apply", tmp_path / "auto.json", files / "fp32.onnx", "--data",
                        files / "calib.npz", "--out", tmp_path / "again.onnx")
    assert code == 0, err
    assert (tmp_path / "again.onnx").read_bytes() == (tmp_path / "auto.onnx").read_bytes()


@pytest.mark.parametrize("gate, status, verdict", [
    (("--max-rel-loss", "5"), 0, "met relative loss <= 5 % of 1: command "),  # FP32 scores 1
    (("--min-metric", "1.5"), 1, "missed metric >= 1.5: command "),
])
def test_the_evaluation_gate_exits_0_when_met_and_1_when_missed(files, fallback_run, capsys, tmp_path, gate,
                                                                 status, verdict):
    out = tmp_path / "gated.onnx"
    code, stdout, err = _run(capsys, "apply", fallback_run / "plan.json", files / "fp32.onnx", "--data",
                             files / "calib.npz", "-o", out, "--evaluate", ma.score_command(files), *gate)
    assert code == status, err
    last = stdout.splitlines()[-1]
    assert last.startswith(verdict) and 0.9 < float(last.removeprefix(verdict)) < 1.0
    assert out.read_bytes() == (fallback_run / "mixed.onnx").read_bytes()  # written either way


def _renamed(files, tmp_path) -> str:  # noqa: ANN001
    """A re-export of the FP32 model whose conv2 became conv_2."""
    model = onnx.load(str(files / "fp32.onnx"))
    (node,) = [n for n in model.graph.node if n.name == "conv2"]
    node.name = "conv_2"
    path = tmp_path / "reexport.onnx"
    onnx.save(model, str(path))
    return str(path)


def test_nodes_a_re_export_renamed_are_all_named_with_the_closest_names(files, fallback_run, capsys,
                                                                        tmp_path):
    plan = json.loads((fallback_run / "plan.json").read_text())
    plan["exclude"] = ["conv2", "conv1x"]  # two nodes the re-export lacks
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    code, stdout, err = _run(capsys, "apply", tmp_path / "plan.json", _renamed(files, tmp_path), "--data",
                             files / "calib.npz", "-o", tmp_path / "out.onnx")
    assert (code, stdout) == (2, "")
    assert err == ("quantdbg apply: error: The model lacks 2 node(s) the plan names (renamed by a "
                   "re-export?): 'conv2' (closest: 'conv_2', 'conv3', 'conv1'); 'conv1x' (closest: 'conv1', "
                   "'conv3', 'conv_2'). The plan refers to nodes by name: export with the same node names, "
                   "or run `quantdbg auto` on this model.\n")
    assert not (tmp_path / "out.onnx").exists()
    with pytest.raises(ModelError, match=r"^The model lacks 2 node\(s\) the plan names"):
        apply_recipe(_renamed(files, tmp_path), files / "calib.npz", FallbackPlan.from_dict(plan))


def test_a_plan_without_its_calibration_is_refused_with_the_way_out(files, fallback_run, capsys, tmp_path):
    plan = FallbackPlan.read(fallback_run / "plan.json")
    bare = type(plan).from_dict({k: v for k, v in plan.to_dict().items() if k not in ("calib", "quant")})
    path = bare.write(tmp_path / "qdq_plan.json")
    code, _, err = _run(capsys, "apply", path, files / "fp32.onnx", "--data", files / "calib.npz", "-o",
                        tmp_path / "out.onnx")
    assert code == 2
    assert err.startswith(f"quantdbg apply: error: {str(path)!r} is a fallback plan of a model quantized "
                          "elsewhere (or written before plans recorded their calibration)")
    assert "`quantdbg fallback FP32.onnx --data CALIB.npz ...`" in err
    with pytest.raises(ConfigError, match="is a fallback plan of a model quantized elsewhere"):
        apply_recipe(files / "fp32.onnx", files / "calib.npz", bare)


@pytest.mark.parametrize("options, message", [
    (("--evaluate", "python s.py {model}"), "--evaluate scores the result against a target: add "
                                            "--max-rel-loss PCT or --min-metric X."),
    (("--min-metric", "1"), "--max-rel-loss, --min-metric and --lower-is-better describe the --evaluate "
                            "command's metric; add --evaluate CMD."),
])
def test_a_target_needs_its_evaluation_and_back(files, fallback_run, capsys, tmp_path, options, message):
    code, _, err = _run(capsys, "apply", fallback_run / "plan.json", files / "fp32.onnx", "--data",
                        files / "calib.npz", "-o", tmp_path / "out.onnx", *options)
    assert (code, err) == (2, f"quantdbg apply: error: {message}\n")
