"""The journal: append-only JSON lines, a checksum chain that refuses a changed file, a torn last line
dropped, ingredients that name what differs, older formats refused, and what a failed run leaves."""
from __future__ import annotations

import errno
import hashlib
import json
import os
import pickle

import pytest

from quantdbg import _journal
from quantdbg._fingerprint import digest, file_digest
from quantdbg._journal import Journal
from quantdbg.errors import ConfigError, DataError, FormatError, QuantDbgWarning

RUN = {"model": "1f", "evaluation command's file 'score.py'": "aa", "target": "9c"}


def _filled(path, values=(1.0, 2.0, 3.0)):
    journal = Journal.open(path, "auto", RUN)
    for index, value in enumerate(values):
        journal.record(f"evaluation:{index}", {"value": value})
    return journal


def test_entries_are_appended_never_rewritten_and_read_back(tmp_path):
    path = tmp_path / "j.partial"
    _filled(path, (1.0, 2.0))
    before = path.read_bytes()
    journal = Journal.open(path, "auto", RUN)
    assert journal.entries == {"evaluation:0": {"value": 1.0}, "evaluation:1": {"value": 2.0}}
    journal.record("calibration:x", [1, "inf", None])
    after = path.read_bytes()
    assert after.startswith(before) and after.count(b"\n") == before.count(b"\n") + 1
    lines = [json.loads(line) for line in after.decode().splitlines()]
    assert lines[0] == {"format": "quantdbg.journal/1", "ingredients": RUN, "kind": "auto"}
    assert [line["key"] for line in lines[1:]] == ["evaluation:0", "evaluation:1", "calibration:x"]
    assert Journal.open(path, "auto", RUN).get("calibration:x") == [1, "inf", None]


def test_each_entry_is_chained_to_the_one_before(tmp_path):
    path = tmp_path / "j.partial"
    _filled(path, (1.0, 2.0))
    header, first, second = [json.loads(line) for line in path.read_text().splitlines()]
    start = digest("quantdbg.journal/1", "auto", _journal.canonical(header["ingredients"]))
    assert first["chain"] == digest(start, "evaluation:0", '{"value":1.0}')
    assert second["chain"] == digest(first["chain"], "evaluation:1", '{"value":2.0}')


@pytest.mark.parametrize(("line", "edit"), [
    (2, lambda entry: entry["value"].update(value=0.0)),   # a score set to 0 by hand
    (3, lambda entry: entry.update(key="evaluation:9")),   # an entry renamed
    (1, lambda header: header["ingredients"].update(target="00")),  # the run it belongs to changed
])
def test_a_journal_changed_by_hand_is_refused_in_one_line(tmp_path, line, edit):
    path = tmp_path / "j.partial"
    _filled(path)
    lines = [json.loads(text) for text in path.read_text().splitlines()]
    edit(lines[line - 1])
    path.write_text("".join(json.dumps(entry) + "\n" for entry in lines))
    if line == 1:  # the header now names other ingredients: the first entry no longer follows it
        with pytest.raises(ConfigError, match=r"\(line 2 does not match its checksum\)"):
            Journal.open(path, "auto", {**RUN, "target": "00"})
        return
    with pytest.raises(ConfigError) as err:
        Journal.open(path, "auto", RUN)
    assert str(err.value) == (f"Resume file {str(path)!r} was changed after quantdbg wrote it (line {line} "
                              "does not match its checksum), so its results cannot be trusted; pass "
                              "--restart to start over (or delete the file).")


def test_a_torn_last_line_is_dropped_with_a_warning_and_cut_off_before_the_next_entry(tmp_path):
    path = tmp_path / "j.partial"
    _filled(path, (1.0, 2.0))
    whole = path.read_bytes()
    _filled(tmp_path / "three", (1.0, 2.0, 3.0))
    third = (tmp_path / "three").read_bytes()[len(whole):]
    for cut in (1, len(third) // 2, len(third) - 1):  # killed while writing the third entry
        path.write_bytes(whole + third[:cut])
        with pytest.warns(QuantDbgWarning, match=r"its last line was cut short .* it is dropped and that "
                                                 r"result made again"):
            journal = Journal.open(path, "auto", RUN)
        assert list(journal.entries) == ["evaluation:0", "evaluation:1"]
        journal.record("evaluation:2", {"value": 3.0})
        assert path.read_bytes() == (tmp_path / "three").read_bytes()


def test_a_file_killed_as_it_was_created_is_an_empty_journal(tmp_path):
    path = tmp_path / "j.partial"
    for left in (b"", b'{"format":"quantdbg.jou'):
        path.write_bytes(left)
        journal = Journal.open(path, "auto", RUN)
        assert journal.entries == {}
        journal.record("evaluation:0", {"value": 1.0})
        assert Journal.open(path, "auto", RUN).entries == {"evaluation:0": {"value": 1.0}}


def test_a_journal_of_another_run_names_what_changed(tmp_path):
    path = tmp_path / "j.partial"
    _filled(path)
    other = {**RUN, "evaluation command's file 'score.py'": "bb"}
    with pytest.raises(ConfigError) as err:
        Journal.open(path, "auto", other)
    assert str(err.value) == (f"Resume file {str(path)!r} belongs to another run: the evaluation command's "
                              "file 'score.py' changed; pass --restart to start over (or delete the file).")
    with pytest.raises(ConfigError, match=r"belongs to another run: the model and the target changed;"):
        Journal.open(path, "auto", {**RUN, "model": "2f", "target": "00"})
    with pytest.raises(ConfigError, match=r"belongs to another run: the evaluation command's file 'x\.txt' "
                                          r"changed;"):
        Journal.open(path, "auto", {**RUN, "evaluation command's file 'x.txt'": "cc"})  # a new file
    with pytest.raises(ConfigError, match=r"belongs to a `quantdbg auto` run, not `quantdbg fallback`; "
                                          r"choose another resume file, or pass --restart"):
        Journal.open(path, "fallback", RUN)


@pytest.mark.parametrize("old", ["quantdbg.auto-progress/1", "quantdbg.sensitivity-progress/1",
                                 "quantdbg.sensitivity/1"])
def test_a_progress_file_of_an_older_quantdbg_is_refused_in_one_line(tmp_path, old):
    path = tmp_path / "j.partial"
    path.write_text(json.dumps({"format": old, "fingerprint": "fp", "evaluations": {}}, indent=2) + "\n")
    with pytest.raises(ConfigError) as err:
        Journal.open(path, "auto", RUN)
    assert str(err.value) == (f"Resume file {str(path)!r} was written by an older version of quantdbg "
                              f"({old}); pass --restart to start over (or delete the file).")


@pytest.mark.parametrize("text", ["1\n", "{not json", "hello\nworld\n", '{"format": "other/1"}\n'])
def test_a_file_that_is_no_journal_is_refused_and_never_deleted(tmp_path, text):
    path = tmp_path / "j.partial"
    path.write_text(text)
    with pytest.raises(FormatError, match=r"^Resume file '.*j\.partial' is not a quantdbg journal; choose "
                                          r"another resume file"):
        Journal.open(path, "auto", RUN)
    with pytest.raises(FormatError, match="is not a quantdbg journal"):
        _journal.remove(path)
    assert path.read_text() == text


def test_restart_removes_a_journal_also_an_older_or_edited_one(tmp_path):
    path = tmp_path / "j.partial"
    _filled(path)
    _journal.remove(path)
    assert not path.exists()
    _journal.remove(path)  # nothing to remove: fine
    path.write_text(json.dumps({"format": "quantdbg.auto-progress/1"}))
    _journal.remove(path)
    assert not path.exists()
    _filled(path)
    path.write_text(path.read_text().replace('"value":1.0', '"value":0.0'))
    _journal.remove(path)
    assert not path.exists()


def test_a_run_that_fails_on_bad_input_before_any_evaluation_leaves_no_journal(tmp_path):
    path = tmp_path / "j.partial"
    with pytest.raises(DataError), Journal.open(path, "auto", RUN) as journal:
        journal.record("calibration:x", [1.0])  # a pass, no evaluation
        raise DataError("bad labels")
    assert not path.exists()
    with pytest.raises(KeyboardInterrupt), Journal.open(path, "auto", RUN) as journal:
        journal.record("calibration:x", [1.0])
        raise KeyboardInterrupt  # a signal keeps what was done
    assert path.exists()
    with pytest.raises(DataError), Journal.open(path, "auto", RUN) as journal:
        journal.record("evaluation:0", {"value": 1.0})
        raise DataError("bad labels")  # an evaluation was made: kept for the rerun
    assert list(Journal.open(path, "auto", RUN).entries) == ["calibration:x", "evaluation:0"]
    with pytest.raises(ConfigError), Journal.open(path, "auto", RUN):
        raise ConfigError("target")  # settings must change, but this run did not create the journal
    assert path.exists()
    path.unlink()
    with pytest.raises(ConfigError), Journal.open(path, "auto", RUN) as journal:
        journal.record("evaluation:0", {"value": 1.0})
        raise ConfigError("target")  # ... and one it created goes
    assert not path.exists()


def test_a_copy_sent_to_a_worker_never_writes_the_file(tmp_path):
    path = tmp_path / "j.partial"
    journal = _filled(path, (1.0,))
    before = path.read_bytes()
    copy = pickle.loads(pickle.dumps(journal))
    assert copy.path is None and copy.entries == journal.entries
    copy.record("evaluation:9", {"value": 9.0})
    assert path.read_bytes() == before


def test_a_journal_in_memory_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    journal = Journal.open(None, "auto", {})
    journal.record("evaluation:0", {"value": 1.0})
    assert journal.get("evaluation:0") == {"value": 1.0} and list(tmp_path.iterdir()) == []


def test_stored_values_are_encoded_only_for_a_file(tmp_path):
    made: list[str] = []

    def compute() -> list[float]:
        made.append("value")
        return [1.0, 2.0]

    def encode(value: list[float]) -> list[float]:
        made.append("encoded")
        return value

    memory = Journal.open(None, "auto", {})
    first = memory.stored("calibration:x", compute, encode, lambda data, where: list(data))
    assert memory.stored("calibration:x", compute, encode, lambda data, where: []) is first
    assert made == ["value"]  # computed once, never encoded
    assert pickle.loads(pickle.dumps(memory)).stored("calibration:x", compute, encode, None) == first
    on_file = Journal.open(tmp_path / "j.partial", "auto", RUN)
    on_file.stored("calibration:x", compute, encode, lambda data, where: list(data))
    assert made == ["value", "value", "encoded"]
    again = Journal.open(tmp_path / "j.partial", "auto", RUN)
    assert again.stored("calibration:x", compute, encode, lambda data, where: list(data)) == [1.0, 2.0]
    assert made == ["value", "value", "encoded"]  # read back, not computed


def test_a_full_disk_is_one_line_naming_the_file_and_the_half_line_is_cut_off_later(tmp_path, monkeypatch):
    path = tmp_path / "j.partial"
    journal = _filled(path, (1.0,))
    real_write = os.write

    def full(fd, data):  # the disk fills up halfway through the entry
        real_write(fd, bytes(data[:10]))
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "write", full)
    with pytest.raises(ConfigError) as err:
        journal.record("evaluation:1", {"value": 2.0})
    assert str(err.value) == (f"Cannot write the resume file {str(path)!r}: No space left on device; free "
                              "space or choose another resume file.")
    monkeypatch.setattr(os, "write", real_write)
    journal.record("evaluation:2", {"value": 3.0})
    assert Journal.open(path, "auto", RUN).entries == {"evaluation:0": {"value": 1.0},
                                                        "evaluation:2": {"value": 3.0}}


def test_file_digest_is_the_digest_of_the_contents(tmp_path):
    path = tmp_path / "big.bin"
    data = hashlib.sha256(b"seed").digest() * 70_000  # more than one read chunk
    path.write_bytes(data)
    assert file_digest(path) == digest(data)
