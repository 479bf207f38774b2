"""An append-only JSONL journal of every attempt and verdict: what makes a run resumable.

One line per finished unit of work, written and flushed as soon as it is done. A run killed at
any moment leaves at worst one partial last line, which the reader ignores (that unit is redone);
a restarted run skips every id already in the journal, so nothing is lost and nothing is repeated.
The journal also records the run's arguments, so a restart with different ones cannot silently
mix two datasets. Every source writes one attempt line per item (`attempt_entry`), with the reason
it gave no pair (`DropReason`) that the run's summary counts by.
"""
from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from evaluator.record import Status, Verdict
from tasks.spec import Task


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


class DropReason(StrEnum):
    """Why an attempt gave no pair: the one list the run's summary counts by."""

    SURVIVED = "survived"                          # the evaluator found no fault in the mutant
    COMPOUND = "compound"                          # a compound's second bug is not seen behind the first
    UNEXPLAINED = "unexplained"                    # no true explanation for what was observed
    REPAIR_NOT_CONFIRMED = "repair not confirmed"  # the repaired kernel is not graded correct
    TEXT_RULES = "text rules"                      # the row breaks a rule on model-facing text
    GIVEAWAY = "giveaway"                          # failing and repair differ beyond the fix
    CORRECT_FIRST_TRY = "correct on the first try"
    NOT_REPAIRED = "not repaired"                  # no repair confirmed: the search or the model's turns ran out
    TRUNCATED = "truncated"                        # an answer cut off mid-code: its intent is gone
    ATTEMPT_CORRECT = "attempt is correct"         # a replayed attempt that passes
    GRADER_LIMIT = "grader_limit"                  # the evaluator could not run the attempt
    UNVERIFIED = "unverified"                      # the evaluator could not check all of what it runs
    NO_EXPLANATION = "no explanation"              # a repair that came without one
    NOT_LOADED = "task not loaded"                 # a peer suite's task that does not load here


@dataclass(frozen=True)
class Dropped:
    reason: DropReason
    detail: str = ""

    def text(self) -> str:
        return f"{self.reason}: {self.detail}" if self.detail else str(self.reason)


def undecided(verdict: Verdict) -> Dropped | None:
    """Why an attempt the evaluator could not decide gives no pair (no fault is confirmed, none
    ruled out: evaluator.record.UNDECIDED), or None for a verdict that decides."""
    if verdict.status == Status.GRADER_LIMIT:
        return Dropped(DropReason.GRADER_LIMIT, "the evaluator could not run the attempt, so no failure was "
                                                "confirmed")
    if verdict.status == Status.UNVERIFIED:
        return Dropped(DropReason.UNVERIFIED, "the evaluator could not check all the attempt runs, so no "
                                              "failure was confirmed")
    return None


def attempt_entry(item_id: str, task: Task | str, source: str, origin: str, failing: Verdict | None,
                  pair: Any = None, dropped: Dropped | None = None, **extra: Any) -> dict[str, Any]:
    """The journal line for one attempt: `dropped` in words, `drop_reason` to count by. `task`
    is a name where none could be loaded."""
    return {"kind": "attempt", "id": item_id, "task": task if isinstance(task, str) else task.name,
            "source": source, "origin": origin,
            "status": failing.status if failing else None, "stage": failing.stage if failing else None,
            "seconds": round(failing.wall_s, 3) if failing else None,
            "pair": pair.to_dict() if pair else None, "dropped": dropped.text() if dropped else None,
            "drop_reason": dropped.reason if dropped else None, **extra}
