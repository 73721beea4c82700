"""A full disk (ENOSPC) or a folder made read-only (EROFS, EACCES) while a command writes: one line
naming the files, exit status 2, and no partial set of outputs (never a Markdown report without its
HTML); the progress file of ``auto`` keeps what was finished, for the rerun.

Write failures are injected at the n-th file written (every write goes through ``_io``), or by the
folder itself turning read-only mid-run (permission bits, which do not bind root).
"""
from __future__ import annotations

import errno
import json
import os
import tempfile

import models_sensitivity as ms
import pytest

import quantdbg._io as io_
import quantdbg.cli.lint as cli_lint
from quantdbg._io import commit_together
from quantdbg.cli import main
from quantdbg.errors import OutputError

FULL = "No space left on device"
PUBLISH = io_.publish


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """FP32 mlp4 and its Q/DQ form, calibration/eval data and a sensitivity result."""
    return ms.write_cli_folder(tmp_path_factory.mktemp("write_failures"))


def _fail_at(monkeypatch, n, code=errno.ENOSPC, text=FULL):
    """Makes the n-th file written (1-based) fail as the disk would; returns the count of writes."""
    calls = []

    def publish(tmp, dest):
        calls.append(dest)
        if len(calls) == n:
            raise OSError(code, text)
        PUBLISH(tmp, dest)

    monkeypatch.setattr(io_, "publish", publish)
    return calls


def _failed(capsys, argv, names, reason=FULL):
    """Runs ``argv``; asserts status 2 and the one line naming every output of the set."""
    capsys.readouterr()
    assert main(argv) == 2
    listed = ", ".join(repr(str(n)) for n in names)
    assert capsys.readouterr().err == (f"quantdbg {argv[0]}: error: Cannot write {listed}: {reason}; nothing "
                                       "was written.\n")


def _sets(folder, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    return {
        "lint": (["lint", str(folder / "q.onnx"), "--json", str(out / "l.json"), "--md", str(out / "l.md")],
                 [out / "l.json", out / "l.md"]),
        "report": (["report", str(folder / "r.json"), "--html", str(out / "r.html"), "--md",
                    str(out / "r.md"), "--no-plots"], [out / "r.md", out / "r.html"]),
        "demo --export": (["demo", "--export", str(out)], [out / n for n in ("model.onnx", "calib.npz",
                                                                              "eval.npz", "score.py")]),
    }, out


@pytest.mark.parametrize("command", ["lint", "report", "demo --export"])
def test_a_full_disk_at_any_file_of_the_set_writes_none(folder, tmp_path, capsys, monkeypatch, command):
    cases, out = _sets(folder, tmp_path)
    argv, names = cases[command]
    for n in range(1, len(names) + 1):
        calls = _fail_at(monkeypatch, n)
        _failed(capsys, argv, names)
        assert len(calls) == n and list(out.iterdir()) == []  # no file, no temporary, no lock left


def test_doctor_writes_its_three_reports_or_none(folder, tmp_path, capsys, monkeypatch):
    out = tmp_path / "out"
    out.mkdir()
    names = [out / "d.json", out / "d.md", out / "d.html"]  # the order they are written in
    _fail_at(monkeypatch, 2)  # the second of the three
    _failed(capsys, ["doctor", str(folder / "m.onnx"), "--data", str(folder / "calib.npz"), "--checks",
                     "weight_zeroing", "--json", str(names[0]), "--md", str(names[1]), "--html",
                     str(names[2]), "--no-progress"], names)
    assert list(out.iterdir()) == []


def _journal_full_at(monkeypatch, journal, n):
    """Makes the n-th write to the resume journal ``journal`` fail as a full disk would."""
    real, calls = os.write, []

    def write(fd, data):
        if os.readlink(f"/proc/self/fd/{fd}") == str(journal.resolve()):
            calls.append(fd)
            if len(calls) == n:
                raise OSError(errno.ENOSPC, FULL)
        return real(fd, data)

    monkeypatch.setattr(os, "write", write)
    return calls


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc to tell the journal's writes")
@pytest.mark.parametrize(("where", "n"), [("journal", 1), ("journal", 3), ("outputs", 1), ("outputs", 2)])
def test_a_full_disk_while_auto_runs_is_one_line_and_the_rerun_finishes(folder, tmp_path, capsys, monkeypatch,
                                                                        where, n):
    plan, out = tmp_path / "p.json", tmp_path / "x.onnx"
    argv = ["auto", str(folder / "m.onnx"), "--data", str(folder / "calib.npz"), "--eval",
            str(folder / "eval.npz"), "--metric", "cosine", "--min-metric", "1.01", "--out", str(out),
            "--plan", str(plan), "--no-progress"]
    if where == "journal":
        calls = _journal_full_at(monkeypatch, tmp_path / "p.json.partial", n)
        message = (f"Cannot write the resume file {str(plan) + '.partial'!r}: {FULL}; free space or choose "
                   "another resume file.")
    else:
        calls = _fail_at(monkeypatch, n)
        message = f"Cannot write {str(out)!r}, {str(plan)!r}: {FULL}; nothing was written."
    capsys.readouterr()
    assert main(argv) == 2
    assert len(calls) == n
    assert capsys.readouterr().err == f"quantdbg auto: error: {message}\n"
    assert not out.exists() and not plan.exists() and not (tmp_path / "x.onnx.data").exists()
    monkeypatch.undo()
    assert main(argv) == 1  # the disk has room again: the rerun finishes (target unreachable: status 1)
    assert out.is_file() and json.loads(plan.read_text())["met"] is False


def test_a_folder_turned_read_only_is_one_line_with_nothing_written(folder, tmp_path, capsys, monkeypatch):
    """EROFS as the file system reports it, injected where the command creates files in --json's folder
    (after it took its lock there: the folder turned read-only mid-run)."""
    out = tmp_path / "out"
    out.mkdir()
    for name in ("mkstemp", "mkdtemp"):
        real = getattr(tempfile, name)

        def read_only(*args, _real=real, **kwargs):
            if kwargs.get("dir") is not None and os.path.samefile(kwargs["dir"], out):
                raise OSError(errno.EROFS, "Read-only file system", str(kwargs["dir"]))
            return _real(*args, **kwargs)

        monkeypatch.setattr(tempfile, name, read_only)
    names = [out / "l.json", out / "l.md"]
    _failed(capsys, ["lint", str(folder / "q.onnx"), "--json", str(names[0]), "--md", str(names[1])], names,
            "Read-only file system")
    assert list(out.iterdir()) == []


@pytest.mark.skipif(os.geteuid() == 0, reason="permission bits do not bind root")
def test_a_folder_made_read_only_mid_run_is_one_line(folder, tmp_path, capsys, monkeypatch):
    out = tmp_path / "out"
    out.mkdir()
    real = cli_lint.lint

    def lint_then_lock_folder(*args, **kwargs):
        report = real(*args, **kwargs)
        out.chmod(0o555)  # after the check and the lock, before the reports are written
        return report

    monkeypatch.setattr(cli_lint, "lint", lint_then_lock_folder)
    names = [out / "l.json", out / "l.md"]
    try:
        _failed(capsys, ["lint", str(folder / "q.onnx"), "--json", str(names[0]), "--md", str(names[1])],
                names, "Permission denied")
        assert [p.name for p in out.iterdir() if not p.name.endswith(".lock")] == []
    finally:
        out.chmod(0o755)


def test_a_rename_that_fails_puts_back_what_the_set_replaced(tmp_path, monkeypatch):
    (tmp_path / "a.md").write_text("old a")
    real, calls = os.replace, []

    def replace(src, dst):
        calls.append(dst)
        if len(calls) == 2:  # the second file of the set, after the first replaced a.md
            raise OSError(errno.EROFS, "Read-only file system")
        real(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(OutputError) as failed:
        with commit_together({"md": tmp_path / "a.md", "html": tmp_path / "b.html"}) as staged:
            staged["md"].write_text("new a")
            staged["html"].write_text("new b")
    monkeypatch.setattr(os, "replace", real)
    assert failed.value.errno == errno.EROFS
    assert str(failed.value) == (f"Cannot write {str(tmp_path / 'a.md')!r}, {str(tmp_path / 'b.html')!r}: "
                                 "Read-only file system; nothing was written.")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.md"]
    assert (tmp_path / "a.md").read_text() == "old a"


def test_any_other_os_error_is_one_line_naming_the_file(folder, capsys, monkeypatch):
    import quantdbg.cli.report as cli_report

    def unreadable(path):
        raise PermissionError(errno.EACCES, "Permission denied", str(path))

    monkeypatch.setattr(cli_report, "load_result", unreadable)
    assert main(["report", str(folder / "r.json"), "--md", "-"]) == 2
    assert capsys.readouterr().err == (f"quantdbg report: error: {str(folder / 'r.json')!r}: Permission "
                                       "denied.\n")
