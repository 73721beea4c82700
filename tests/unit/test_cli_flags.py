"""Flags users bring from other tools: ModelOpt's underscore spellings work (and stay out of
--help), trtexec's switches get an answer saying what quantdbg does instead, a typo is matched only
to a flag of its kind, and ``auto`` takes ``--min-sqnr`` like ``fallback``."""
from __future__ import annotations

import json

import models_sensitivity as ms
import numpy as np
import pytest
from cli_usage import usage_error as _usage

from quantdbg.cli import build_parser, main


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("flags")
    x = ms.write_mlp4_pair(folder)
    np.savez(folder / "calib.npz", x=x)
    return folder


def _parsed(argv):
    found = vars(build_parser().parse_args(argv))
    found.pop("onnx_path", None)
    return found


MODELOPT = {
    "calibrate": ("calibrate --onnx_path m.onnx --calibration_data_path c.npz --calibration_method minmax "
                  "--nodes_to_exclude fc0 --op_types_to_exclude Gemm --output_path o.onnx",
                  "calibrate m.onnx --data c.npz --method minmax --exclude fc0 --op-types-to-exclude Gemm "
                  "--out o.onnx"),
    "analyze": ("analyze --onnx_path m.onnx --calibration_data_path c.npz --eval e.npz --calibration_method "
                "mse --output_path r.json",
                "analyze m.onnx --data c.npz --eval e.npz --method mse --out r.json"),
    "fallback": ("fallback --eval e.npz --onnx_path m.onnx --calibration_data_path c.npz --min-sqnr 30 "
                 "--output_path x.onnx --plan p.json --nodes_to_exclude 'fc*'",
                 "fallback m.onnx --eval e.npz --data c.npz --min-sqnr 30 --out x.onnx --plan p.json "
                 "--exclude 'fc*'"),
    "auto": ("auto --onnx_path m.onnx --calibration_data_path c.npz --eval e.npz --metric top1 "
             "--max-rel-loss 1 --output_path x.onnx --plan p.json --calibration_method minmax",
             "auto m.onnx --data c.npz --eval e.npz --metric top1 --max-rel-loss 1 --out x.onnx "
             "--plan p.json --method minmax"),
    "doctor": ("doctor --onnx_path m.onnx --calibration_data_path c.npz --calibration_method minmax",
               "doctor m.onnx --data c.npz --method minmax"),
    "lint": ("lint --onnx_path q.onnx", "lint q.onnx"),
}


@pytest.mark.parametrize("command", list(MODELOPT))
def test_modelopt_spellings_parse_as_quantdbg_flags(command):
    modelopt, quantdbg = MODELOPT[command]
    assert _parsed(modelopt.replace("'", "").split()) == _parsed(quantdbg.replace("'", "").split())


def test_modelopt_spellings_stay_out_of_help_and_messages(capsys):
    with pytest.raises(SystemExit):
        main(["calibrate", "--help"])
    text = capsys.readouterr().out
    assert "--data CALIB.npz" in text and "--out OUT.onnx" in text and "--method" in text
    for alias in ("--onnx_path", "--calibration_data_path", "--calibration_method", "--nodes_to_exclude",
                  "--op_types_to_exclude", "--output_path"):
        assert alias not in text
    with pytest.raises(SystemExit):
        main(["calibrate", "m.onnx"])
    assert capsys.readouterr().err == ("quantdbg calibrate: error: the following arguments are required: "
                                       "--data, -o/--out/--output (see `quantdbg calibrate --help`)\n")


def test_onnx_path_or_model_but_not_both(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["calibrate", "a.onnx", "--onnx_path", "b.onnx", "--data", "c.npz", "-o", "o.onnx"])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err == ("quantdbg calibrate: error: MODEL 'a.onnx' and --onnx_path 'b.onnx' "
                                       "both name the model; give only one of them (see `quantdbg "
                                       "calibrate --help`)\n")


def test_a_modelopt_command_line_writes_what_the_quantdbg_one_writes(folder, tmp_path):
    common = ["--no-progress"]
    assert main(["calibrate", "--onnx_path", str(folder / "m.onnx"), "--calibration_data_path",
                 str(folder / "calib.npz"), "--calibration_method", "minmax", "--nodes_to_exclude", "fc0",
                 "--output_path", str(tmp_path / "a.onnx"), *common]) == 0
    assert main(["calibrate", str(folder / "m.onnx"), "--data", str(folder / "calib.npz"), "--method",
                 "minmax", "--exclude", "fc0", "--out", str(tmp_path / "b.onnx"), *common]) == 0
    assert (tmp_path / "a.onnx").read_bytes() == (tmp_path / "b.onnx").read_bytes()


CALIBRATE = ("calibrate", "m.onnx", "--data", "c.npz", "-o", "o.onnx")
HABITS = {
    "--int8": "--int8 is trtexec's: quantdbg always writes explicit INT8 (Q/DQ) models; there is nothing to "
              "switch on",
    "--fp16": "--fp16 is trtexec's: the layers quantdbg keeps out of INT8 run in FP16 (--precision of "
              "fallback and auto, default fp16); name them with --exclude NODE, or let fallback / auto "
              "choose them",
    "--best": "--best is trtexec's: quantdbg always writes explicit INT8 (Q/DQ) models, and the layers kept "
              "out of INT8 run in FP16; name them with --exclude NODE, or let fallback / auto choose them",
    "--saveEngine=m.engine": "--saveEngine is trtexec's: quantdbg builds no engine: it writes the ONNX model "
                             "(--out), and fallback / auto put the trtexec command that builds it in --plan",
}


@pytest.mark.parametrize("flag", list(HABITS))
def test_trtexec_switches_are_answered_with_what_quantdbg_does_instead(capsys, flag):
    assert _usage(capsys, *CALIBRATE, flag) == (f"quantdbg calibrate: error: unrecognized arguments: {flag}; "
                                                f"{HABITS[flag]} (see `quantdbg calibrate --help`)\n")


def test_a_typo_is_matched_to_a_flag_of_its_kind(capsys):
    analyze = ("analyze", "q.onnx", "--eval", "e.npz", "-o", "r.json")
    assert "; did you mean --fp32? " in _usage(capsys, *analyze, "--fp33", "m.onnx")  # a value for a value
    assert "did you mean" not in _usage(capsys, *analyze, "--fp33")  # a switch: --fp32 takes a path
    assert "; did you mean --no-evidence? " in _usage(capsys, *analyze, "--no-evidense")
    assert "; did you mean --lower-is-better? " in _usage(capsys, *analyze, "--lower-is-beter")
    assert "did you mean" not in _usage(capsys, *analyze, "--lower-is-beter=yes")  # a switch takes no value
    assert "; did you mean --batch-size? " in _usage(capsys, *CALIBRATE, "--batch-sise=8")


def test_auto_takes_min_sqnr_like_fallback(folder, tmp_path, capsys):
    base = ["auto", str(folder / "m.onnx"), "--data", str(folder / "calib.npz"), "--eval",
            str(folder / "calib.npz"), "--out", str(tmp_path / "x.onnx"), "--plan", str(tmp_path / "p.json"),
            "--no-progress"]
    assert main([*base, "--min-sqnr", "25"]) == 0
    result = json.loads((tmp_path / "p.json").read_text())
    target = {"kind": "sqnr", "threshold": 25.0, "lower_is_better": False, "reference": None}
    assert result["target"] == target
    assert result["met"] and result["final_value"] >= 25.0
    capsys.readouterr()
    refusals = {
        ("--min-sqnr", "25", "--metric", "top1"):
            "--min-sqnr judges the output SQNR, not --metric top1; drop --metric, or give --min-metric or "
            "--max-rel-loss.",
        ("--min-sqnr", "25", "--labels", "y"):
            "--min-sqnr judges the output SQNR; --evaluate/--labels go with --min-metric or --max-rel-loss.",
        ("--max-rel-loss", "1"):
            "--min-metric and --max-rel-loss judge a task metric: give --evaluate CMD, --labels KEY or "
            "--metric NAME (or the target --min-sqnr DB, which reads the output SQNR).",
    }
    for extra, message in refusals.items():
        assert main([*base, *extra]) == 2
        assert capsys.readouterr().err == f"quantdbg auto: error: {message}\n"
