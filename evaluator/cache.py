"""A persistent, content-addressed cache of verdicts: the same candidate is not graded twice.

The key is a hash of everything that decides a verdict:
- the exact extracted code, not normalised, because messages quote line numbers;
- a content hash of the task's files and one of the evaluator's code (evaluator/digest.py), so an
  edit to either misses;
- split, backend, TPU generation, numerics, seeds per case, the early-stop setting, the stage
  graded through, and the worker step limit;
- the seed policy. A fixed `--seed` is part of the key. With fresh seeds (no `--seed`) every run
  shares one key, so a hit returns a verdict graded on other seeds than a new grading would draw;
- on real hardware, the device kind, because timings and speedups hold only for the device they
  were measured on.

The store is one sqlite file in write-ahead-log mode. Several processes and threads on one
machine may read and write it at once (sqlite locks the file; a writer waits up to 60 s). Do not
share it across machines on a network file system: sqlite's locking is not reliable there. A
cluster shares a cache by giving each node its own, or by a server-backed store (see
docs/scaling.md).

Verdicts that the grading infrastructure decided (a sandbox worker that crashed, an actor that
died) are not stored: they say nothing certain about the candidate.
"""
from __future__ import annotations

import hashlib
import json
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

from evaluator.candidate.extract import ExtractionError, extract_code
from evaluator.digest import evaluator_digest, task_digest
from evaluator.record import Verdict
from tasks.spec import Task

# error_type of verdicts that describe the grading machinery rather than the candidate
UNCACHEABLE_ERRORS = frozenset({"WorkerCrash", "ActorDied"})


def cache_key(task: Task, answer: str, settings: dict[str, Any]) -> str:
    """The content hash that keys a verdict (see the module docstring)."""
    try:
        code = extract_code(answer, task.entry_points)
    except ExtractionError:
        code = answer   # the verdict is an extraction error: the answer itself decides it
    payload = {"code": code, "task": task.name, "task_files": task_digest(task),
               "evaluator": evaluator_digest(), **settings}
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()


class VerdictCache:
    """Verdicts by key in `<folder>/verdicts.sqlite3`; safe for concurrent use on one machine."""

    def __init__(self, folder: str | Path):
        self.folder = Path(folder)
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ValueError(f"cannot use {self.folder} as a verdict cache: {exc}") from None
        self.path = self.folder / "verdicts.sqlite3"
        self._local = threading.local()
        with self._connection() as db:
            db.execute("CREATE TABLE IF NOT EXISTS verdicts (key TEXT PRIMARY KEY, task TEXT NOT NULL, "
                       "status TEXT NOT NULL, verdict TEXT NOT NULL, created REAL NOT NULL)")
        self.hits = self.misses = 0

    def _connection(self) -> sqlite3.Connection:
        """One connection per thread (sqlite connections are not shared across threads)."""
        db = getattr(self._local, "db", None)
        if db is None:
            db = sqlite3.connect(self.path, timeout=60.0)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            self._local.db = db
        return db

    def get(self, key: str) -> Verdict | None:
        row = self._connection().execute("SELECT verdict FROM verdicts WHERE key = ?", (key,)).fetchone()
        if row is None:
            self.misses += 1
            return None
        self.hits += 1
        verdict = Verdict.from_dict(json.loads(row[0]))
        verdict.cached = True
        return verdict

    def put(self, key: str, verdict: Verdict) -> bool:
        """Store a verdict; False when it is one the cache does not keep. A verdict graded
        through a named stage (status pending: `estimate`'s) is kept like any other: the stage
        is part of its key."""
        if verdict.error_type in UNCACHEABLE_ERRORS:
            return False
        data = json.dumps({**verdict.to_dict(), "cached": False})
        with self._connection() as db:
            db.execute("INSERT OR REPLACE INTO verdicts VALUES (?, ?, ?, ?, ?)",
                       (key, verdict.task, verdict.status, data, time.time()))
        return True

    def __len__(self) -> int:
        return self._connection().execute("SELECT COUNT(*) FROM verdicts").fetchone()[0]
