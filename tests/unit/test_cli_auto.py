"""``quantdbg auto`` end to end: an evaluation command on the real models, the files it writes, exit
status 0 (met) / 1 (not met) / 2 (bad input, one line), and its options' vocabularies."""
from __future__ import annotations

import argparse
import json
import shlex
from html import escape as html_escape

import models_auto as ma
import numpy as np
import onnx
import pytest
from tool_grammars import modelopt, run, trtexec, trtexec_shapes

from quantdbg.cli import build_parser, main
from quantdbg.cli._options import READY_METRICS
from quantdbg.config import Precision
from quantdbg.pipeline import AutoResult, apply_recipe
from quantdbg.pipeline.config import REPAIRS
from quantdbg.qdq import quantize
from quantdbg.sensitivity.config import MODES


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """The clipped MLP, its data, the FP32 outputs on the evaluation data and a scoring script."""
    rng = np.random.default_rng(0)
    return ma.write_task_files(tmp_path_factory.mktemp("auto"), ma.clipped_mlp(), ma.clipped_inputs(rng),
                               ma.clipped_inputs(rng))


_command = ma.score_command


def _run(capsys, *argv) -> tuple[int, str, str]:  # noqa: ANN001
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_met_with_an_evaluation_command_exits_0(files, capsys, tmp_path):
    out, plan, html = tmp_path / "mixed.onnx", tmp_path / "plan.json", tmp_path / "report.html"
    code, stdout, err = _run(capsys, "auto", files / "fp32.onnx", "--data", files / "calib.npz", "--eval",
                             files / "eval.npz", "--evaluate", _command(files), "--max-rel-loss", "5",
                             "--out", out, "--plan", plan, "--html", html, "--no-progress")
    assert code == 0, err
    result = AutoResult.read(plan)
    assert result.outcome == "repaired" and result.metric == "command"
    assert result.fp32_value == pytest.approx(1.0)
    assert 0.95 <= result.int8_value == result.final_value < 1.0
    # the calibrator choice is the INT8 start (its outputs are far closer to FP32) and meets the target:
    # the default calibration and the other repairs cost no evaluation
    decisions = [(r.repair, r.applied, r.kept, r.at_start) for r in result.repairs]
    assert decisions == [("calibrator", True, True, True)]
    lines = stdout.splitlines()
    assert lines[:2] == [result.message, "evaluations: reference 1, int8 1 (2 in all)"]
    assert stdout.startswith("INT8 with the calibrator per tensor meets relative loss <= 5 % of 1: "
                             "command 0.9")
    # No layer left INT8, and the INT8 model at --out still gets its build commands: printed, in the
    # plan section of the JSON (no layer excluded), and in the report's Build section.
    assert result.plan is not None and result.plan.exclude == () and result.plan.build is not None
    commands = result.plan.commands
    assert lines[2:] == [line for what, command in commands.lines() for line in (f"{what}:", f"  {command}")]
    section = json.loads(plan.read_text())["plan"]
    assert section["exclude"] == [] and section["tensorrt"]["build"]["commands"] == commands.to_dict()
    built = run(commands.trtexec, ["trtexec"], trtexec())
    assert built.onnx == str(out) and built.saveEngine == str(out.with_suffix(".engine"))
    # The profile rule: any batch from 1 to --batch-size (default 32), the other dims from the model.
    assert [trtexec_shapes(getattr(built, f"{w}Shapes")) for w in ("min", "opt", "max")] == [
        {"x": (1, 8)}, {"x": (32, 8)}, {"x": (32, 8)}]
    mo = run(commands.modelopt, ["python", "-m", "modelopt.onnx.quantization"], modelopt())
    assert (mo.onnx_path, mo.calibration_data_path, mo.nodes_to_exclude) == (
        str(files / "fp32.onnx"), str(files / "calib.npz"), [])
    report = html.read_text()
    assert '<section id="build">' in report and html_escape(commands.trtexec, quote=False) in report
    written = onnx.load(str(out))
    again = apply_recipe(files / "fp32.onnx", files / "calib.npz", plan)
    assert written.SerializeToString() == again.model.SerializeToString()
    assert html_escape(result.message, quote=False) in html.read_text()
    written = sorted(p.name for p in tmp_path.iterdir())
    assert written == ["mixed.onnx", "plan.json", "report.html"]  # the .partial file is gone


def test_not_met_exits_1_with_the_best_model_and_keeps_a_given_resume_file(files, capsys, tmp_path):
    out, plan, resume = tmp_path / "mixed.onnx", tmp_path / "plan.json", tmp_path / "progress.json"
    argv = ("auto", files / "fp32.onnx", "--data", files / "calib.npz", "--eval", files / "eval.npz",
            "--metric", "sqnr", "--min-metric", "200", "--precision", "fp32", "--out", out, "--plan", plan,
            "--resume", resume, "--repairs")
    code, stdout, _ = _run(capsys, *argv)
    assert code == 1
    result = AutoResult.read(plan)
    assert not result.met and result.repairs == () and stdout.splitlines()[0] == result.message
    assert stdout.startswith("Missed metric >= 200: ")
    assert out.is_file() and resume.is_file()
    code, again, _ = _run(capsys, *argv)  # everything answered by the resume file
    assert code == 1 and again == stdout


def test_a_fallback_writes_the_build_of_the_model_at_out(files, capsys, tmp_path):
    out, plan = tmp_path / "mixed.onnx", tmp_path / "plan.json"
    code, stdout, _ = _run(capsys, "auto", files / "fp32.onnx", "--data", files / "calib.npz", "--eval",
                           files / "eval.npz", "--metric", "sqnr", "--min-metric", "25", "--repairs",
                           "--max-fallback", "100", "--out", out, "--plan", plan, "--no-progress",
                           "--profile", "2,4,8")
    assert code == 0
    result = AutoResult.read(plan)
    assert result.outcome == "fallback" and result.plan is not None and result.plan.build is not None
    commands = result.plan.commands
    lines = stdout.splitlines()
    assert lines[lines.index("trtexec (strongly typed):") + 1] == f"  {commands.trtexec}"
    assert shlex.split(commands.trtexec)[1] == f"--onnx={out}"
    built = run(commands.trtexec, ["trtexec"], trtexec())
    assert [trtexec_shapes(getattr(built, f"{w}Shapes")) for w in ("min", "opt", "max")] == [
        {"x": (2, 8)}, {"x": (4, 8)}, {"x": (8, 8)}]
    modelopt = shlex.split(commands.modelopt)
    assert modelopt[modelopt.index("--onnx_path") + 1] == str(files / "fp32.onnx")
    assert modelopt[modelopt.index("--calibration_data_path") + 1] == str(files / "calib.npz")
    assert modelopt[modelopt.index("--nodes_to_exclude") + 1:][:len(result.exclude)] == list(result.exclude)


def _error(capsys, *argv) -> str:  # noqa: ANN001
    with pytest.raises(SystemExit) as exit_info:
        main([str(a) for a in argv])
    assert exit_info.value.code == 2
    return capsys.readouterr().err


def test_bad_input_is_one_line_with_status_2(files, capsys, tmp_path):
    base = ("auto", files / "fp32.onnx", "--data", files / "calib.npz", "--eval", files / "eval.npz")
    outputs = ("--out", tmp_path / "m.onnx", "--plan", tmp_path / "p.json")
    assert _error(capsys, *base, "--metric", "sqnr", *outputs) == (
        "quantdbg auto: error: one of the arguments --min-metric --max-rel-loss --min-sqnr is required (see "
        "`quantdbg auto --help`)\n")
    assert main([str(a) for a in (*base, "--max-rel-loss", "1", *outputs)]) == 2  # --min-sqnr needs no metric
    assert capsys.readouterr().err == (
        "quantdbg auto: error: --min-metric and --max-rel-loss judge a task metric: give --evaluate CMD, "
        "--labels KEY or --metric NAME (or the target --min-sqnr DB, which reads the output SQNR).\n")
    assert _error(capsys, *base, "--metric", "sqnr", "--max-rel-loss", "1", "--repairs", "bias", *outputs) \
        .startswith("quantdbg auto: error: argument --repairs: invalid choice: 'bias' (choose from ")
    cases = [
        (("--metric", "sqnr", "--max-rel-loss", "1", *outputs),
         "A relative-loss target needs a finite FP32 metric, but sqnr of the FP32 model is inf; give an "
         "absolute "
         "bound instead (FallbackTarget.min_metric, --min-metric)."),
        (("--metric", "sqnr", "--min-metric", "30", "--out", tmp_path / "no" / "m.onnx", "--plan",
          tmp_path / "p.json"),
         f"--out '{tmp_path / 'no' / 'm.onnx'}': folder '{tmp_path / 'no'}' does not exist."),
        (("--metric", "sqnr", "--min-metric", "30", "--max-fallback", "0", *outputs),
         "--max-fallback is a percentage in (0, 100], got 0."),
        (("--metric", "sqnr", "--min-metric", "30", "--batch-size", "0", *outputs),
         "--batch-size must be >= 1, got 0."),
        (("--evaluate", "python score.py", "--min-metric", "0.9", *outputs),
         "The evaluation command 'python score.py' does not contain {model}; put {model} where the model "
         "path goes, "
         "e.g. 'python eval.py {model}'."),
        (("--metric", "sqnr", "--lower-is-better", "--min-metric", "30", *outputs),
         "--lower-is-better describes the --evaluate command's metric; add --evaluate CMD."),
    ]
    for extra, message in cases:
        code, _, err = _run(capsys, *base, *extra)
        assert (code, err) == (2, f"quantdbg auto: error: {message}\n")
    quantize(files / "fp32.onnx", files / "calib.npz").save(tmp_path / "int8.onnx")
    code, _, err = _run(capsys, "auto", tmp_path / "int8.onnx", *base[2:], "--metric", "sqnr", "--min-metric",
                        "30", *outputs)
    assert code == 2 and err.startswith("quantdbg auto: error: The model is already quantized: ")
    assert err.count("\n") == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["int8.onnx"]  # nothing written on bad input


def _option(flag: str, command: str = "auto") -> argparse.Action:
    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return next(a for a in commands.choices[command]._actions if flag in a.option_strings)


def test_auto_and_fallback_take_the_same_search_options():
    # one search, one budget rule: the two commands offer and describe its options alike
    for flag in ("--mode", "--precision", "--max-evaluations"):
        mine, theirs = _option(flag), _option(flag, "fallback")
        assert (mine.choices, mine.default, mine.type, mine.help) == \
            (theirs.choices, theirs.default, theirs.type, theirs.help), flag


def test_choices_are_the_library_vocabularies():
    assert tuple(_option("--repairs").choices) == REPAIRS and _option("--repairs").default == list(REPAIRS)
    assert tuple(_option("--mode").choices) == MODES
    assert tuple(_option("--metric").choices) == READY_METRICS
    assert tuple(_option("--precision").choices) == tuple(p.value for p in Precision)
