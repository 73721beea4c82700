"""Atomic writes leave either the old file or the new one, never a partial one."""
from __future__ import annotations

import json

import pytest

from quantdbg._io import atomic_file, write_json_atomic, write_text_atomic
from quantdbg.errors import ConfigError, ModelError


def test_atomic_write_replaces_and_leaves_no_temp(tmp_path):
    path = tmp_path / "a.json"
    write_text_atomic(path, "old")
    write_json_atomic(path, {"b": 1, "a": [1.5]})
    assert json.loads(path.read_text()) == {"a": [1.5], "b": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["a.json"]


def test_atomic_write_failure_keeps_the_old_file(tmp_path):
    path = tmp_path / "a.json"
    write_text_atomic(path, "old")
    with pytest.raises(TypeError):
        write_json_atomic(path, {"x": object()})
    assert path.read_text() == "old"
    with pytest.raises(ConfigError, match="does not exist"):
        write_text_atomic(tmp_path / "no" / "a.txt", "x")


def test_written_files_get_umask_permissions_not_mkstemp_0600(tmp_path):
    import os
    umask = os.umask(0o022)
    try:
        path = write_text_atomic(tmp_path / "r.md", "x")
    finally:
        os.umask(umask)
    assert oct(path.stat().st_mode & 0o777) == oct(0o644)


def test_atomic_file_publishes_on_success_and_discards_on_failure(tmp_path):
    path = tmp_path / "m.onnx"
    with atomic_file(path) as tmp:
        assert tmp.parent == tmp_path and tmp.name.startswith(".m.onnx.") and not path.exists()
        tmp.write_bytes(b"new")
    assert path.read_bytes() == b"new"
    with pytest.raises(RuntimeError, match="writer failed"):
        with atomic_file(path) as tmp:
            tmp.write_bytes(b"half")
            raise RuntimeError("writer failed")
    assert path.read_bytes() == b"new" and [p.name for p in tmp_path.iterdir()] == ["m.onnx"]
    with pytest.raises(ModelError, match=r"Cannot write .*: folder .* does not exist\."):
        with atomic_file(tmp_path / "no" / "m.onnx", ModelError):
            pass
