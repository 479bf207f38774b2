"""The verified variant pool: `python -m data_gen.pool`.

    python -m data_gen.pool                    # verify what is new or stale, rewrite the pool
    python -m data_gen.pool --task softmax     # only these tasks (the others are kept as they are)
    python -m data_gen.pool --check            # exit 1 if any entry is stale; grades nothing

The mutation source injects bugs into many correct kernels per task, not one, so a dataset has
many different repairs. Verifying a kernel costs a grading (seconds), more than the default
`collect` run can spend on hundreds of them, so the pool is built by this command and committed
(`datasets/variant-pool/variants.jsonl`, with a card).

Each entry is keyed by a content hash of everything that decides its verdict: the variant's
source, the files of its task (task.py and the `tasks` modules it imports), the evaluator's
code, the jax version and the grading settings. No version string is involved, so nobody has
to remember to bump one: when any of those change, the entry is stale. This command re-grades
stale and new candidates only; `collect` re-verifies a stale entry before using it.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from data_gen.failures.fingerprint import fingerprint
from data_gen.failures.variants import Candidate, candidates
from evaluator.digest import evaluator_digest, task_digest
from evaluator.record import Verdict
from tasks import UnknownTaskError, all_tasks, get_task
from tasks.spec import Task

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_POOL = ROOT / "datasets" / "variant-pool"
POOL_FILE = "variants.jsonl"
DEFAULT_PER_TASK = 7      # correct kernels kept per task
REWRITES_PER_SEED = 12    # rewrites proposed per seed (most are never graded)
SPLIT = "train"


@dataclass
class PoolEntry:
    """One graded candidate. Rejected ones are kept (without source) so they are not retried."""

    task: str
    name: str
    seed: str
    origin: str
    recipe: dict
    fingerprint: str
    inputs_hash: str
    status: str
    message: str = ""
    source: str = ""
    verdict: dict = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.status == "correct"

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)


# --- what decides a verdict ----------------------------------------------------------------------

def grading_settings(backend: str) -> dict[str, Any]:
    """The settings every pool grading uses; part of each entry's hash."""
    return {"split": SPLIT, "backend": backend, "n_seeds": 1}


def inputs_hash(task: Task, source: str, backend: str) -> str:
    """The content hash that keys a pool entry (see the module docstring)."""
    h = hashlib.sha256(source.encode())
    h.update(task_digest(task).encode())
    h.update(evaluator_digest().encode())
    h.update(json.dumps(grading_settings(backend), sort_keys=True).encode())
    return h.hexdigest()[:24]


# --- the pool file ------------------------------------------------------------------------------

def load_pool(folder: Path = DEFAULT_POOL) -> list[PoolEntry]:
    """Entries of a pool folder; an absent pool is empty."""
    path = folder / POOL_FILE
    if not path.is_file():
        return []
    entries = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if line.strip():
            try:
                entries.append(PoolEntry(**json.loads(line)))
            except (json.JSONDecodeError, TypeError) as exc:
                raise ValueError(f"{path}:{number}: not a pool entry ({exc}); rebuild it with "
                                 f"python -m data_gen.pool") from exc
    return entries


def is_fresh(entry: PoolEntry, backend: str) -> bool:
    return entry.inputs_hash == inputs_hash(get_task(entry.task), entry.source, backend)


def pool_variants(entries: list[PoolEntry]) -> dict[str, list[tuple[str, str]]]:
    """Each task's correct pool kernels as (name, source), the solution first."""
    variants: dict[str, list[tuple[str, str]]] = {}
    for entry in sorted(entries, key=lambda e: (e.task, e.name != "solution", e.name)):
        if entry.ok:
            variants.setdefault(entry.task, []).append((entry.name, entry.source))
    return variants


def fresh_verdicts(entries: list[PoolEntry], backend: str) -> tuple[dict[str, Verdict], int]:
    """Verdicts of the correct entries whose hash is current, keyed as collect keys repairs; and
    how many correct entries are stale (collect grades those again before their first use)."""
    from data_gen.sources.grading import repair_key

    fresh, stale = {}, 0
    for entry in (e for e in entries if e.ok):
        if is_fresh(entry, backend):
            fresh[repair_key(entry.task, entry.source)] = Verdict.from_dict(entry.verdict)
        else:
            stale += 1
    return fresh, stale


def write_pool(entries: list[PoolEntry], folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    entries = sorted(entries, key=lambda e: (e.task, not e.ok, e.name))
    tmp = folder / (POOL_FILE + ".tmp")
    tmp.write_text("".join(e.to_json() + "\n" for e in entries))
    tmp.replace(folder / POOL_FILE)
    (folder / "README.md").write_text(pool_card(entries))


def pool_card(entries: list[PoolEntry]) -> str:
    kept = [e for e in entries if e.ok]
    rows = []
    for task in sorted({e.task for e in entries}):
        mine = [e for e in kept if e.task == task]
        origins = Counter(e.origin for e in mine)
        rows.append(f"| {task} | {len(mine)} | {len({e.fingerprint for e in mine})} | "
                    f"{origins['solution']} | {origins['alternative']} | {origins['rewrite']} | "
                    f"{sum(1 for e in entries if e.task == task and not e.ok)} |")
    return f"""# variant-pool: verified correct Pallas kernels, several per train task

Made by `python -m data_gen.pool`; read by `python -m data_gen.collect`, which injects bugs into
these kernels and uses each as the repair of its own mutants (docs/data-generation.md).

- {len(kept)} correct kernels over {len({e.task for e in kept})} tasks, {len({e.fingerprint for e in kept})} distinct
  after normalising comments, docstrings, whitespace and identifier names.
- Every kept entry was graded `correct` on all of its task's train cases; `rejected` counts
  candidates the evaluator turned down (kept in the file so they are not graded again).
- Origins: `solution` (the task's solution), `alternative` (a hand-written kernel in
  `tasks/<task>/variants/`), `rewrite` (other block sizes, with or without comments).
- Each entry's `inputs_hash` covers its source, its task's files, the evaluator's code, the
  jax version and the grading settings; `python -m data_gen.pool --check` lists stale ones.

| task | kept | distinct | solution | alternative | rewrite | rejected |
|---|---:|---:|---:|---:|---:|---:|
{chr(10).join(rows)}
"""


# --- building ------------------------------------------------------------------------------------

def build(tasks: list[Task], folder: Path, per_task: int, workers: int,
          console: Any) -> tuple[list[PoolEntry], int]:
    """Grade new and stale candidates, round by round, until each task has `per_task` correct
    kernels or no candidates left; keep the other tasks' entries as they are. Returns the pool
    as written and how many candidates were graded."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from data_gen.sources.grading import seed_for
    from evaluator.grader import Evaluator, Job

    names = {t.name for t in tasks}
    old = load_pool(folder)
    with Evaluator(workers=workers, n_seeds=1, stop_at_first_failure=True) as evaluator:
        backend = evaluator.backend.name
        known = {e.inputs_hash: e for e in old if e.task in names}
        proposals = {t.name: [(c, inputs_hash(t, c.source, backend)) for c in candidates(t, REWRITES_PER_SEED)]
                     for t in tasks}
        decided: dict[str, list[PoolEntry]] = {t.name: [] for t in tasks}
        cursor = dict.fromkeys(decided, 0)
        graded = 0
        columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
        with Progress(*columns, console=console) as progress:
            bar = progress.add_task("verifying variants", total=None)
            while True:
                batch: list[tuple[str, Candidate, str]] = []
                for task in tasks:
                    missing = per_task - sum(e.ok for e in decided[task.name])
                    while missing > 0 and cursor[task.name] < len(proposals[task.name]):
                        cand, key = proposals[task.name][cursor[task.name]]
                        cursor[task.name] += 1
                        if key in known:
                            decided[task.name].append(known[key])
                            missing -= known[key].ok
                        else:
                            batch.append((task.name, cand, key))
                            missing -= 1
                if not batch:
                    break
                progress.update(bar, total=graded + len(batch))
                jobs = [Job(get_task(name), c.source, SPLIT, seed_for(f"pool:{key}")) for name, c, key in batch]
                verdicts = evaluator.grade_many(jobs, on_done=lambda _: progress.advance(bar))
                graded += len(batch)
                for (name, cand, key), verdict in zip(batch, verdicts):
                    decided[name].append(_entry(cand, key, verdict))
    kept = [e for e in old if e.task not in names] + [e for es in decided.values() for e in es]
    write_pool(kept, folder)
    return kept, graded


def _entry(cand: Candidate, key: str, verdict: Any) -> PoolEntry:
    ok = verdict.status == "correct"
    return PoolEntry(cand.task, cand.name, cand.seed, cand.origin, cand.recipe, fingerprint(cand.source), key,
                     verdict.status, "" if ok else verdict.message[:300], cand.source if ok else "",
                     verdict.to_dict() if ok else {})


def stale_entries(entries: list[PoolEntry], backend: str) -> list[PoolEntry]:
    return [e for e in entries if e.ok and not is_fresh(e, backend)]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m data_gen.pool", description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--task", dest="tasks", action="append", help="only this task (repeatable)")
    p.add_argument("--pool", type=Path, default=DEFAULT_POOL, help="pool folder")
    p.add_argument("--per-task", type=int, default=DEFAULT_PER_TASK, help="correct kernels kept per task")
    p.add_argument("--workers", type=int, default=2, help="evaluator worker processes")
    p.add_argument("--check", action="store_true", help="only report stale entries (exit 1 if any)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    from rich.console import Console

    from evaluator.execution.backends import default_backend

    args = parse_args(argv)
    console = Console(stderr=True)
    try:
        tasks = [get_task(n) for n in args.tasks] if args.tasks else [t for t in all_tasks() if not t.heldout_task]
        held = [t.name for t in tasks if t.heldout_task]
        if held:
            raise ValueError(f"held-out tasks never feed training data: {', '.join(held)}")
        if args.check:
            names = {t.name for t in tasks}
            stale = stale_entries([e for e in load_pool(args.pool) if e.task in names], default_backend())
            for e in stale:
                print(f"stale: {e.task} {e.name}")
            print(f"{len(stale)} stale entries in {args.pool / POOL_FILE}")
            return 1 if stale else 0
        start = time.perf_counter()
        entries, graded = build(tasks, args.pool, args.per_task, args.workers, console)
    except (UnknownTaskError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    kept = [e for e in entries if e.ok]
    console.print(f"{len(kept)} correct kernels ({len({e.fingerprint for e in kept})} distinct) over "
                  f"{len({e.task for e in kept})} tasks in {args.pool / POOL_FILE}; graded {graded} "
                  f"new or stale candidates in {time.perf_counter() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
