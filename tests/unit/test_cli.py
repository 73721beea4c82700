"""The CLI's shared conventions: usage errors are one line on stderr with exit status 2, and the
choices it offers are the library's own vocabularies."""
from __future__ import annotations

import argparse

import pytest

from quantdbg.calibration import available_calibrators
from quantdbg.cli import build_parser, main
from quantdbg.config import Precision
from quantdbg.diagnostics import CHECKS
from quantdbg.evaluation import METRIC_NAMES
from quantdbg.sensitivity import MODES


def test_usage_error_is_one_line_with_status_2(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["calibrate"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith("quantdbg calibrate: error: the following arguments are required: MODEL")


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
    assert list(commands.choices) == ["calibrate", "analyze", "fallback", "auto", "lint", "report", "doctor",
                                      "demo"]


def test_choices_are_the_library_vocabularies():
    for command in ("analyze", "fallback"):
        assert tuple(_option(command, "--mode").choices) == MODES
        assert tuple(_option(command, "--metric").choices) == (*METRIC_NAMES, "top1")
    assert set(MODES) == {"local", "cumulative", "isolated", "leave-one-out"}
    assert tuple(_option("fallback", "--precision").choices) == tuple(p.value for p in Precision)
    assert tuple(_option("doctor", "--checks").choices) == CHECKS
    assert tuple(_option("doctor", "--fail-on").choices) == ("high", "medium", "low", "info")
    assert _option("calibrate", "--method").metavar == "{" + ",".join(available_calibrators()) + "}"
    assert {"minmax", "entropy", "percentile", "mse"} <= set(available_calibrators())


def test_a_choice_outside_the_vocabulary_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["analyze", "m.onnx", "--eval", "e.npz", "--out", "o.json", "--mode", "global"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith("quantdbg analyze: error: argument --mode: invalid choice: 'global' (choose from ")
