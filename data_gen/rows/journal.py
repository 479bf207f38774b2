"""An append-only JSONL journal of every attempt and verdict: what makes a run resumable.

One line per finished unit of work, written and flushed as soon as it is done. A run killed at
any moment leaves at worst one partial last line, which the reader ignores (that unit is redone);
a restarted run skips every id already in the journal, so nothing is lost and nothing is repeated.
The journal also records the run's arguments, so a restart with different ones cannot silently
mix two datasets.
"""
from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any


class JournalMismatch(ValueError):
    """The journal was written by a run with different arguments."""


class Journal:
    def __init__(self, path: Path, settings: dict[str, Any], new_run_option: str = "--name"):
        """`new_run_option`: the command's option that starts a run elsewhere (said in the refusal)."""
        self.path = path
        self._lock = threading.Lock()
        path.parent.mkdir(parents=True, exist_ok=True)
        entries = list(self.read())
        if entries and entries[0].get("kind") == "run":
            if entries[0]["settings"] != settings:
                changed = sorted(k for k in {*settings, *entries[0]["settings"]}
                                 if settings.get(k) != entries[0]["settings"].get(k))
                raise JournalMismatch(
                    f"{path} was written with other settings ({', '.join(changed)} differ); pass the same "
                    f"arguments to resume, {new_run_option} for a new run, or --fresh to start this one over")
        else:
            self._write({"kind": "run", "settings": settings}, truncate=True)
        self._end_partial_line()
        self.entries = [e for e in entries if e.get("kind") != "run"]
        self.done = {e["id"] for e in self.entries if "id" in e}

    def read(self) -> Iterator[dict[str, Any]]:
        if not self.path.exists():
            return
        with self.path.open() as f:
            for line in f:
                try:
                    yield json.loads(line)
                except json.JSONDecodeError:
                    continue  # the partial last line of a killed run: that unit is redone

    def append(self, entry: dict[str, Any]) -> None:
        with self._lock:
            self._write(entry)
            self.entries.append(entry)
            if "id" in entry:
                self.done.add(entry["id"])

    def _end_partial_line(self) -> None:
        """A killed run may have left half a line: end it, so the next entry starts on its own."""
        with self.path.open("rb+") as f:
            if f.seek(0, os.SEEK_END) == 0:
                return
            f.seek(-1, os.SEEK_END)
            if f.read(1) != b"\n":
                f.write(b"\n")

    def _write(self, entry: dict[str, Any], truncate: bool = False) -> None:
        line = json.dumps(entry, sort_keys=True) + "\n"
        with self.path.open("w" if truncate else "a") as f:
            f.write(line)
            f.flush()
            os.fsync(f.fileno())
