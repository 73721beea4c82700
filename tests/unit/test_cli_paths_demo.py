"""``demo --export DIR`` and ``demo --out DIR`` replace no file already in DIR unless ``--force``."""
from __future__ import annotations

import hashlib

from quantdbg.cli import main
from quantdbg.demo import EXPORT_FILES, RUN_FILES, SCORE_SCRIPT, load_embedded


def _digests(folder):
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def test_export_refuses_to_replace_files_without_force(tmp_path, capsys):
    (tmp_path / "model.onnx").write_bytes(b"my own model")
    (tmp_path / "score.py").write_text("print('my own metric')\n")
    (tmp_path / "notes.txt").write_text("unrelated")
    before = _digests(tmp_path)
    assert main(["demo", "--export", str(tmp_path)]) == 2
    assert capsys.readouterr().err == (f"quantdbg demo: error: --export {str(tmp_path)!r} already holds "
                                       "model.onnx, score.py; add --force to replace them, or choose another "
                                       "folder.\n")
    assert _digests(tmp_path) == before
    assert main(["demo", "--export", str(tmp_path), "--force"]) == 0
    capsys.readouterr()
    after = _digests(tmp_path)
    assert sorted(after) == sorted([*EXPORT_FILES, "notes.txt"]) and after["notes.txt"] == before["notes.txt"]
    assert (tmp_path / "model.onnx").read_bytes() == load_embedded().model_path.read_bytes()
    assert (tmp_path / "score.py").read_text() == SCORE_SCRIPT


def test_a_demo_run_refuses_a_folder_holding_its_report(tmp_path, capsys):
    (tmp_path / "report.html").write_text("<p>last week's report</p>")
    before = _digests(tmp_path)
    assert main(["demo", "--out", str(tmp_path)]) == 2
    assert capsys.readouterr().err == (f"quantdbg demo: error: --out {str(tmp_path)!r} already holds "
                                       "report.html; add --force to replace it, or choose another folder.\n")
    assert _digests(tmp_path) == before
    assert "report.html" in RUN_FILES and "plan.json" in RUN_FILES
