"""The CLI's shared conventions: usage errors are one line on stderr with exit status 2."""
from __future__ import annotations

import pytest

from quantdbg.cli import main


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
