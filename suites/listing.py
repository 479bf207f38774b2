"""`tasks --suite`: a checkout's entries listed at once, and a cache of what building them found.

Building an imported task runs their reference in a sandboxed worker at several sizes (a second
or more per entry), so a listing that built every entry took minutes. A listing reads only what
needs no running: names, kinds, levels, files. What a build found (loaded or why not, the
signature, the cases and their sizes) comes from a cache that every build fills (`Suite.task`:
`run --task`, `check-solutions`, `check-suite`, `tasks --suite ... --load`).

A record is keyed by the bytes `load` reads (the entry's baseline or problem file), the entry's
name, kind and level, and a digest of the adapter (suites/oracle.py ADAPTER_ROOTS and what they
import, docstrings left out; the jax version):
an edit to either misses. The cache is only for listing and reporting; a grading always builds
its task, since the Task needs the sandboxed reference.

Where: `$PALLAS_KERNEL_GYM_SUITE_CACHE`, else `$XDG_CACHE_HOME/pallas-kernel-gym/suite-loads`
(`~/.cache/...` without XDG_CACHE_HOME). One JSON file per record; delete the folder to clear it.
"""
from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import json
import os
import sys
import tempfile
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from evaluator.digest import code_digest
from suites.jaxbench import Entry, Loaded
from suites.oracle import ADAPTER_ROOTS

CACHE_ENV = "PALLAS_KERNEL_GYM_SUITE_CACHE"
PROJECT = "pallas-kernel-gym"
FORMAT = 1  # of a record; part of the key
NOT_YET = "not yet loaded"


def cache_dir() -> Path:
    """The folder of load records: the override, else the user's cache folder."""
    override = os.environ.get(CACHE_ENV)
    if override:
        return Path(override).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser() / PROJECT / "suite-loads"


@functools.lru_cache(maxsize=1)
def adapter_digest() -> str:
    """Hash of the code that turns a file into a task: a change to it invalidates every record."""
    try:
        jax_version = importlib.metadata.version("jax")
    except importlib.metadata.PackageNotFoundError:
        jax_version = "none"
    return hashlib.sha256(f"jax {jax_version}\n{code_digest(ADAPTER_ROOTS)}".encode()).hexdigest()


def entry_key(entry: Entry) -> str:
    """The record's key: the file's bytes, the entry's identity and the adapter's digest."""
    payload = {"format": FORMAT, "adapter": adapter_digest(), "name": entry.name, "kind": entry.kind,
               "level": entry.level, "file": hashlib.sha256(entry.path.read_bytes()).hexdigest()}
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


@dataclass
class EntryFacts:
    """What building one entry found, as the load cache keeps it and a check-suite row
    (suites.report.SuiteRow) shows it before its gradings."""

    name: str
    loaded: bool
    why_not: str = ""
    check_sizes: dict[str, int] = field(default_factory=dict)
    bench_sizes: dict[str, int] = field(default_factory=dict)
    heldout: str = ""
    cap: int | None = None
    counts_divided_by: int = 1
    hard_coded: bool = False
    repaired: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


@dataclass
class LoadRecord(EntryFacts):
    """An entry's facts plus what a listing shows of its task: the summary (as `tasks --json`
    prints it), the signature and its cases' sizes."""

    signature: str = ""
    summary: dict[str, Any] = field(default_factory=dict)  # Task.summary()
    cases: dict[str, dict[str, int]] = field(default_factory=dict)  # case name -> dims
    # Not loaded only because its reference, run, was refused (a constant output): a build for
    # the static stages alone (`estimate`) still makes it a task.
    refused_when_run: bool = False

    def row_fields(self) -> dict[str, Any]:
        """Keyword arguments of a SuiteRow (suites/report.py) without gradings."""
        return {f.name: getattr(self, f.name) for f in fields(EntryFacts)}

    @classmethod
    def from_dict(cls, value: dict[str, Any]) -> "LoadRecord":
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in value.items() if k in known})


def record_loaded(entry: Entry, loaded: Loaded) -> LoadRecord:
    """The record of a task that was built."""
    task = loaded.task
    check = task.select("train", "check")
    bench = task.select("train", "bench")
    return LoadRecord(entry.name, True, signature=task.signature, summary=task.summary(),
                      cases={c.name: dict(c.dims) for c in task.cases},
                      check_sizes=dict(check[0].dims) if check else {},
                      bench_sizes=dict(bench[0].dims) if bench else {},
                      heldout=loaded.heldout_kind, cap=loaded.cap,
                      counts_divided_by=loaded.counts_divided_by, hard_coded=loaded.hard_coded,
                      repaired=list(loaded.repaired), notes=list(loaded.notes))


def record_failed(entry: Entry, why: str, refused_when_run: bool = False) -> LoadRecord:
    return LoadRecord(entry.name, False, why_not=why, refused_when_run=refused_when_run)


def lookup(entry: Entry, folder: Path | None = None) -> LoadRecord | None:
    """The cached record for this entry's current file and adapter, or None."""
    try:
        path = (folder or cache_dir()) / f"{entry_key(entry)}.json"
        value = json.loads(path.read_text())
        return LoadRecord.from_dict(value) if value.get("name") == entry.name else None
    except (OSError, ValueError, TypeError):
        return None


_warned: set[str] = set()


def store(entry: Entry, record: LoadRecord, folder: Path | None = None) -> bool:
    """Write the record atomically (a temporary file, then os.replace): readers and other writers
    see either the old file or the new one. A cache that cannot be written is said once on
    stderr and otherwise ignored: building the task matters, caching it does not."""
    folder = folder or cache_dir()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        target = folder / f"{entry_key(entry)}.json"
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-", suffix=".json")
        try:
            with os.fdopen(fd, "w") as out:
                json.dump(asdict(record), out, indent=1)
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    except OSError as exc:
        if str(folder) not in _warned:
            _warned.add(str(folder))
            print(f"suite load cache not written ({folder}): {exc}", file=sys.stderr)
        return False
    return True


@dataclass
class Listed:
    """One entry as `tasks --suite` lists it: read from the checkout, its load from the cache."""

    name: str
    kind: str
    level: int
    file: str  # relative to the checkout
    optimized: bool
    record: LoadRecord | None = None

    @property
    def status(self) -> str:
        if self.record is None:
            return NOT_YET
        return "loaded" if self.record.loaded else "not loaded"

    def to_dict(self) -> dict[str, Any]:
        """`tasks --suite --json`: a loaded entry's keys are Task.summary()'s, plus these."""
        head = {"name": self.name, "kind": self.kind, "level": self.level, "file": self.file,
                "optimized": self.optimized, "status": self.status}
        r = self.record
        if r is None:
            return {**head, "signature": None, "cases": None}
        return {**r.summary, **head, "why_not": r.why_not, "signature": r.signature or None,
                "cases": r.summary.get("cases"), "case_sizes": r.cases,
                **{k: v for k, v in r.row_fields().items() if k not in ("name", "loaded", "why_not")}}

    def cases_text(self) -> str:
        """Case counts as `tasks` shows them: check+bench / check+bench."""
        counts = (self.record.summary.get("cases") if self.record else None) or {}
        if not counts:
            return "-"
        return (f"{counts['train/check']}+{counts['train/bench']} / "
                f"{counts['heldout/check']}+{counts['heldout/bench']}")

    def status_text(self, width: int = 100) -> str:
        if self.record is None or self.record.loaded:
            return self.status
        return f"not loaded: {' '.join(self.record.why_not.split())[:width]}"


def list_entries(root: Path, entries: list[Entry], known: dict[str, LoadRecord] | None = None,
                 folder: Path | None = None) -> list[Listed]:
    """Every entry with what can be read without running it; its load from `known` (this
    process's builds) or the cache. Nothing here runs their code."""
    known = known or {}
    listed = []
    for e in entries:
        try:
            file = str(e.path.relative_to(root))
        except ValueError:
            file = str(e.path)
        record = known.get(e.name) or lookup(e, folder)
        listed.append(Listed(e.name, e.kind, e.level, file, e.optimized is not None, record))
    return listed


def markdown(rows: list[Listed]) -> str:
    """`tasks --suite --markdown`."""
    lines = ["| task | kind | level | file | optimized.py | status | signature | cases (train/heldout) |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        signature = f"`{r.record.signature}`" if r.record and r.record.signature else "-"
        lines.append(f"| `{r.name}` | {r.kind} | {r.level} | `{r.file}` | {'yes' if r.optimized else '-'} | "
                     f"{r.status_text(120).replace('|', '/')} | {signature} | {r.cases_text()} |")
    return "\n".join(lines)


def fill_hint(spec: str, rows: list[Listed]) -> str | None:
    """One line on how to fill the cache, when some entries are not in it."""
    missing = sum(r.record is None for r in rows)
    if not missing:
        return None
    return (f"{missing} of {len(rows)} entries not yet loaded (nothing of theirs runs to list them): "
            f"`python -m evaluator tasks --suite {spec} --load` or `check-suite {spec}` builds them "
            f"and caches what they show in {cache_dir()}")
