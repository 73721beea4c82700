"""The CLI's usage errors, as a test sees them."""
from __future__ import annotations

import pytest

from quantdbg.cli import main


def usage_error(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """Runs ``quantdbg ARGV``, checks it stops with status 2 and one line on stderr; returns that line."""
    with pytest.raises(SystemExit) as exit_info:
        main(list(argv))
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    return err
