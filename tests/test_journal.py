"""The journal: a half-written line from a killed run is dropped, and what follows still reads."""
import pytest

from data_gen.rows.journal import Journal, JournalMismatch


def test_partial_last_line_is_redone_and_the_next_entry_reads(tmp_path):
    path = tmp_path / "journal.jsonl"
    journal = Journal(path, {"seed": 0})
    journal.append({"id": "a", "kind": "attempt"})
    with path.open("a") as f:
        f.write('{"id": "b", "kind": "att')  # killed mid-write
    reopened = Journal(path, {"seed": 0})
    assert reopened.done == {"a"}
    reopened.append({"id": "b", "kind": "attempt"})
    assert Journal(path, {"seed": 0}).done == {"a", "b"}


def test_other_settings_are_refused(tmp_path):
    Journal(tmp_path / "j.jsonl", {"seed": 0})
    with pytest.raises(JournalMismatch, match="seed"):
        Journal(tmp_path / "j.jsonl", {"seed": 1})
