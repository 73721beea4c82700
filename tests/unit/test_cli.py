"""The CLI's shared conventions: usage errors are one line on stderr with exit status 2, and the
choices it offers are the library's own vocabularies."""
from __future__ import annotations

import argparse
import logging

import pytest
from cli_usage import usage_error

import quantdbg
from quantdbg.calibration import available_calibrators
from quantdbg.cli import build_parser, main
from quantdbg.config import Precision
from quantdbg.diagnostics import CHECKS
from quantdbg.diagnostics.findings import FAIL_ON
from quantdbg.evaluation.metrics import METRIC_NAMES
from quantdbg.sensitivity.config import MODES


def test_usage_error_is_one_line_with_status_2(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["calibrate"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith("quantdbg calibrate: error: the following arguments are required: --data, "
                          "-o/--out/--output (see")
    with pytest.raises(SystemExit) as exit_info:  # MODEL, or ModelOpt's --onnx_path
        main(["calibrate", "--data", "c.npz", "-o", "o.onnx"])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err == ("quantdbg calibrate: error: the following arguments are required: "
                                       "MODEL (see `quantdbg calibrate --help`)\n")


def test_unknown_command_is_one_line(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["no-such-command"])
    assert exit_info.value.code == 2
    assert "invalid choice: 'no-such-command'" in capsys.readouterr().err


def _option(command: str, flag: str):
    """The argparse action of ``flag`` in subcommand ``command``."""
    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return next(a for a in commands.choices[command]._actions if flag in a.option_strings)


def test_subcommands_in_help_order():
    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert list(commands.choices) == ["calibrate", "analyze", "fallback", "auto", "apply", "lint", "report",
                                      "doctor", "demo"]


def test_choices_are_the_library_vocabularies():
    for command in ("analyze", "fallback"):
        assert tuple(_option(command, "--mode").choices) == MODES
        assert tuple(_option(command, "--metric").choices) == (*METRIC_NAMES, "top1")
    assert set(MODES) == {"local", "cumulative", "isolated", "leave-one-out"}
    assert tuple(_option("fallback", "--precision").choices) == tuple(p.value for p in Precision)
    assert tuple(_option("doctor", "--checks").choices) == CHECKS
    # lint and doctor share one severity scale (lint's former words still parse)
    for command in ("lint", "doctor"):
        assert tuple(_option(command, "--fail-on").choices) == FAIL_ON
        assert _option(command, "--fail-on").metavar == "{high,medium,low,info,never}"
    assert _option("lint", "--fail-on").default == "high"
    assert _option("calibrate", "--method").metavar == "{" + ",".join(available_calibrators()) + "}"
    assert {"minmax", "entropy", "percentile", "mse"} <= set(available_calibrators())


def test_a_choice_outside_the_vocabulary_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["analyze", "m.onnx", "--eval", "e.npz", "--out", "o.json", "--mode", "global"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith("quantdbg analyze: error: argument --mode: invalid choice: 'global' (choose from ")


def _commands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices


@pytest.mark.parametrize(("command", "aliases"), [
    ("calibrate", ("--data", "--calib", "--out", "-o", "--output", "--cache", "--calibration-cache",
                   "--exclude", "--nodes-to-exclude", "--op-types", "--op-types-to-exclude")),
    ("analyze", ("--data", "--out", "-o", "--output", "--exclude", "--nodes-to-exclude",
                 "--op-types", "--op-types-to-exclude")),
    ("fallback", ("--data", "--out", "-o", "--output", "--exclude", "--nodes-to-exclude",
                  "--op-types", "--op-types-to-exclude")),
    ("auto", ("--data", "--out", "-o", "--output", "--exclude", "--nodes-to-exclude",
              "--op-types", "--op-types-to-exclude")),
    ("doctor", ("--data",)),
    ("demo", ("--out", "-o", "--output")),
])
def test_flags_users_already_type_are_aliases_of_one_option(command, aliases):
    actions = {flag: action for action in _commands()[command]._actions for flag in action.option_strings}
    for flag, main_flag in (("--calib", "--cache"), ("-o", "--out"), ("--output", "--out"),
                            ("--calibration-cache", "--cache"), ("--nodes-to-exclude", "--exclude")):
        if flag in aliases:
            assert actions[flag] is actions[main_flag]


def test_every_subcommand_has_the_common_options():
    for name, command in _commands().items():
        flags = {flag for action in command._actions for flag in action.option_strings}
        assert {"-v", "--verbose", "-q", "--quiet", "--progress", "--no-progress"} <= flags, name


@pytest.mark.parametrize(("argv", "progress", "isatty"), [
    ([], True, True), ([], False, False), (["--no-progress"], False, True), (["--progress"], True, False)])
def test_progress_defaults_to_whether_stderr_is_a_terminal(monkeypatch, argv, progress, isatty):
    from quantdbg.cli._options import show_progress

    monkeypatch.setattr("sys.stderr.isatty", lambda: isatty)
    for command in ("calibrate m.onnx --data c.npz -o o.onnx", "analyze m.onnx --eval e.npz -o r.json",
                    "doctor m.onnx --data c.npz", "demo"):
        args = build_parser().parse_args([*command.split(), *argv])
        assert show_progress(args) is progress


def test_verbosity_is_counted_before_and_after_the_subcommand():
    from quantdbg.cli._options import log_level

    def level(*argv: str) -> int:
        return log_level(build_parser().parse_args([*argv]))

    assert level("lint", "m.onnx") == logging.WARNING
    assert level("-v", "lint", "m.onnx") == level("lint", "m.onnx", "-v") == logging.INFO
    assert level("-v", "lint", "m.onnx", "-v") == level("lint", "m.onnx", "-vv") == logging.DEBUG
    assert level("lint", "m.onnx", "-q") == logging.ERROR


def test_version(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out == f"quantdbg {quantdbg.__version__}\n"


def test_did_you_mean_for_a_mistyped_flag(capsys):
    err = usage_error(capsys, "calibrate", "m.onnx", "--data", "c.npz", "-o", "o.onnx",
                       "--calibraton-cache", "c.cache")
    assert err == ("quantdbg calibrate: error: unrecognized arguments: --calibraton-cache c.cache; did you "
                   "mean --calibration-cache? (see `quantdbg calibrate --help`)\n")
    # a flag of another subcommand is not suggested
    err = usage_error(capsys, "lint", "m.onnx", "--min-sqnr", "3")
    assert "did you mean" not in err and "unrecognized arguments: --min-sqnr 3" in err


def test_did_you_mean_for_a_mistyped_choice(capsys):
    err = usage_error(capsys, "analyze", "m.onnx", "--eval", "e.npz", "-o", "r.json", "--metric", "sqrn")
    assert err.endswith("; did you mean 'sqnr'? (see `quantdbg analyze --help`)\n")
    assert "did you mean 'calibrate'?" in usage_error(capsys, "calibrat")


def test_op_types_to_exclude_narrows_the_quantized_op_types():
    from quantdbg.cli._options import quant_config
    from quantdbg.errors import ConfigError

    args = build_parser().parse_args(["calibrate", "m.onnx", "--data", "c.npz", "-o", "o.onnx",
                                      "--op-types-to-exclude", "MatMul", "Gemm", "--nodes-to-exclude", "fc*"])
    config = quant_config(args)
    assert config.op_types == ("Conv", "ConvTranspose") and config.exclude == ("fc*",)
    args = build_parser().parse_args(["auto", "m.onnx", "--data", "c.npz", "--eval", "e.npz", "--metric",
                                      "sqnr", "--max-rel-loss", "1", "-o", "o.onnx", "--plan", "p.json",
                                      "--op-types", "Conv", "--op-types-to-exclude", "Gemm"])
    with pytest.raises(ConfigError, match=r"^--op-types-to-exclude 'Gemm' is not a quantized op type "
                                          r"\(choose from Conv\)\.$"):
        quant_config(args)
    args.op_types_to_exclude = ["Conv"]
    with pytest.raises(ConfigError, match="removes every quantized op type"):
        quant_config(args)


def test_demo_export_writes_only_the_files(tmp_path, capsys):
    folder = tmp_path / "new"
    assert main(["demo", "--export", str(folder)]) == 0
    names = ("model.onnx", "calib.npz", "eval.npz", "score.py")
    assert capsys.readouterr().out == f"wrote {', '.join(str(folder / n) for n in names)}\n"
    assert sorted(p.name for p in folder.iterdir()) == sorted(names)
    assert main(["demo", "--export", str(folder), "-o", str(tmp_path / "run")]) == 2
    assert capsys.readouterr().err == ("quantdbg demo: error: --export only writes the demo's files; drop "
                                       "--out, or run the demo without --export.\n")
