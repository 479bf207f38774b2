"""Peer suites under our grader: `--suite jaxbench:PATH` turns a JAXBench checkout's workloads
and KernelBench-JAX problems into tasks (suites/jaxbench.py; docs/peer-suites.md).

Their files are read here as text; their code runs only in a sandboxed worker
(suites/oracle.py, suites/driver.py).
"""
from __future__ import annotations

import atexit
import os
import threading
from pathlib import Path

import tasks
from suites.jaxbench import Entry, Loaded, LoadError, RefusedWhenRun, discover, load
from suites.listing import LoadRecord, record_failed, record_loaded, store
from suites.oracle import ReferenceFailed, ReferenceRunner
from tasks.spec import Task

KINDS = ("jaxbench",)
# Workers that run a suite's code: entries build (and references run) this many at once.
BUILD_WORKERS = min(2, os.cpu_count() or 1)


class SuiteError(ValueError):
    """A --suite value that names no usable suite: one line for the user."""


class Suite:
    """A checkout's entries; each becomes a task when first asked for (building one runs their
    code in the sandbox). Imported tasks stay out of the `tasks` registry: `all_tasks()` is our
    suite, and graders take the Task objects this returns."""

    def __init__(self, kind: str, root: Path, workers: int = BUILD_WORKERS):
        self.kind, self.root = kind, root
        self.spec = f"{kind}:{root.resolve()}"  # what opens this checkout again, in any process
        self.entries = {e.name: e for e in discover(root)}
        self.runner = ReferenceRunner(workers=workers)
        self.loaded: dict[str, Loaded] = {}
        self.records: dict[str, LoadRecord] = {}  # what each build found, also in the load cache
        self._lock = threading.Lock()
        self._building: dict[str, threading.Lock] = {}  # one per entry: others build meanwhile

    def names(self) -> list[str]:
        return list(self.entries)

    def task(self, name: str, run_reference: bool = True) -> Task:
        """The task for one entry; LoadError says why it cannot be one. `run_reference=False`
        builds it for the static stages only (suites.jaxbench.load): a reference that would be
        refused when run is not found out, and the load cache keeps only what a whole build found."""
        entry = self.entries.get(name)
        if entry is None:
            raise tasks.UnknownTaskError(f"{name!r} is not in the suite at {self.root}")
        with self._lock:
            building = self._building.setdefault(name, threading.Lock())
        with building:
            if name in self.loaded and (self.loaded[name].ran or not run_reference):
                return self.loaded[name].task
            failed = self.records.get(name)
            if failed is not None and not failed.loaded and (run_reference or not failed.refused_when_run):
                raise LoadError(failed.why_not)
            try:
                loaded = load(entry, self.runner, run_reference)
            except (LoadError, ReferenceFailed, SyntaxError, OSError) as exc:
                self._record(entry, record_failed(entry, str(exc), isinstance(exc, RefusedWhenRun)))
                raise LoadError(str(exc)) from None
            loaded.task.external.rebuilt_by = (open_task, (self.spec, name))
            self.loaded[name] = loaded
            if loaded.ran:
                self._record(entry, record_loaded(entry, loaded))
            return loaded.task

    def _record(self, entry: Entry, record: LoadRecord) -> None:
        """Keep what the build found, here and in the load cache that `tasks --suite` lists from."""
        self.records[entry.name] = record
        store(entry, record)

    def entry(self, name: str) -> Entry:
        return self.entries[name]

    def close(self) -> None:
        self.runner.close()

    def __enter__(self) -> "Suite":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_suite(spec: str) -> Suite:
    """`jaxbench:PATH` as a Suite; SuiteError with one line for anything else."""
    kind, sep, path = spec.partition(":")
    if not sep or kind not in KINDS or not path:
        raise SuiteError(f"--suite takes KIND:PATH with KIND one of {', '.join(KINDS)}, got {spec!r}")
    root = Path(path).expanduser()
    if not root.is_dir():
        raise SuiteError(f"suite folder not found: {root}")
    try:
        return Suite(kind, root)
    except FileNotFoundError as exc:
        raise SuiteError(str(exc)) from None


_OPEN: dict[str, Suite] = {}
_OPEN_LOCK = threading.Lock()


def open_task(spec: str, name: str) -> Task:
    """An imported task in a process that did not build it (a Ray actor, after the task was
    pickled: tasks.spec.Task.__reduce_ex__): its suite is opened once per process and kept."""
    with _OPEN_LOCK:
        suite = _OPEN.get(spec)
        if suite is None:
            suite = _OPEN[spec] = open_suite(spec)
            atexit.register(suite.close)
    return suite.task(name)


__all__ = ["KINDS", "LoadError", "Suite", "SuiteError", "open_suite", "open_task"]
