"""Progress reporting: items pass through unchanged; a bar or log lines, never stdout."""
from __future__ import annotations

import logging

import numpy as np
import pytest

from quantdbg import _optional, _progress


@pytest.mark.parametrize("enabled", [True, False])
def test_items_pass_through_and_nothing_is_printed(enabled, capsys):
    tracked = _progress.track(iter(range(5)), total=5, desc="calibration", enabled=enabled)
    assert list(tracked) == list(range(5))
    assert capsys.readouterr().out == ""


def test_without_tqdm_progress_is_logged(monkeypatch, caplog):
    monkeypatch.setattr(_optional, "is_available", lambda module: False)
    with caplog.at_level(logging.INFO, logger="quantdbg"):
        items = list(_progress.track(["a", "b"], total=2, desc="calibration", enabled=True))
    assert items == ["a", "b"]
    assert [r.getMessage() for r in caplog.records] == ["calibration: batch 1/2", "calibration: batch 2/2"]
    assert all(r.levelno == logging.INFO for r in caplog.records)


def test_disabled_progress_logs_at_debug_only(caplog):
    with caplog.at_level(logging.INFO, logger="quantdbg"):
        list(_progress.track([1, 2, 3], desc="calibration"))
    assert caplog.records == []


def test_with_tqdm_a_bar_is_drawn_on_stderr_and_nothing_logged(capsys, caplog):
    pytest.importorskip("tqdm", reason="the progress bar needs the [report] extra (tqdm)")
    with caplog.at_level(logging.DEBUG, logger="quantdbg"):
        assert list(_progress.track(range(3), total=3, desc="calibration", enabled=True)) == [0, 1, 2]
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "calibration:" in captured.err and "0/3 [" in captured.err and "batch/s" in captured.err
    assert caplog.records == []


def test_batched_data_is_counted_in_batches_not_samples(capsys):
    pytest.importorskip("tqdm", reason="the progress bar needs the [report] extra (tqdm)")
    from quantdbg.data import ArrayData

    data = ArrayData({"x": np.zeros((10, 3), np.float32)}, batch_size=4)
    assert len(data) == 10 and data.num_batches == 3
    assert len(list(_progress.track(data, desc="sensitivity", enabled=True))) == 3
    err = capsys.readouterr().err
    assert "0/3 [" in err and "/10" not in err


def test_an_error_is_printed_on_its_own_line_after_the_bar(tmp_path, capsys):
    pytest.importorskip("tqdm", reason="the progress bar needs the [report] extra (tqdm)")
    import models
    import onnx

    from quantdbg.cli import main

    onnx.save(models.conv_residual(), tmp_path / "m.onnx")
    np.savez(tmp_path / "c.npz", x=np.zeros((8, 4, 8, 8), np.float64))  # the model takes float32
    assert main(["calibrate", str(tmp_path / "m.onnx"), "--data", str(tmp_path / "c.npz"), "-o",
                 str(tmp_path / "o.onnx"), "--progress", "--batch-size", "4"]) == 2
    err = capsys.readouterr().err
    assert "calibration:" in err and "0/2 [" in err  # the bar was drawn ...
    # ... and cleared before the error, which starts a line of its own
    assert err.rsplit("\r", 1)[1] == ("quantdbg calibrate: error: calibration batch 0: input 'x' expects "
                                      "dtype float32, got float64. Convert it with .astype(np.float32).\n")
