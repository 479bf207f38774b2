"""Seed stability of the verdicts: grade honest kernels on many seeds and report their margins.

    python benchmarks/seed_stability.py                       # every solution, 20 seeds, all splits
    python benchmarks/seed_stability.py --seeds 5 --task matmul --task attention_fwd
    python benchmarks/seed_stability.py --corpus honest --corpus thirdparty --json margins.json
    python benchmarks/seed_stability.py --dtype float32 --corpus solutions --corpus honest \
        --corpus thirdparty --task matmul     # one family's f32 bound: see `worst rel L2`

For every (kernel, case) it grades the kernel on N input seeds (one grading, N seeds per case)
and records the largest error relative to the task's bound (`bound_ratio`: 1.0 is at the
tolerance) and whether any seed failed. A verdict that flips with the seed is a grader bug
(too tight a tolerance, or a kernel at its edge); a margin far above 0.7 is one waiting to
happen. Figures are printed as a table per task and dtype; nothing is asserted here
(tests/test_seed_stability.py checks a sample).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("PALLAS_EVAL_ASSUME_NO_TPU", "1")
os.environ.setdefault("JAX_PLATFORMS", "cpu")


@dataclass
class Margin:
    """One kernel's worst margin per (task, dtype), over every case and seed graded."""

    kernel: str
    task: str
    dtype: str
    worst_ratio: float = 0.0
    worst_rel_l2: float = 0.0  # the largest whole-tensor relative L2 error (tasks.spec.Tolerance)
    cases: int = 0
    failed_cases: list[str] = field(default_factory=list)

    @property
    def flips(self) -> int:
        return len(self.failed_cases)


def honest_kernels(corpora: list[str], task_names: list[str] | None,
                   dtypes: list[str] | None = None) -> list[tuple[str, Any, str, str]]:
    """(label, task or task name, split, source) for the chosen corpora; `dtypes` keeps only
    those cases (a family's f32 bound is measured on its f32 cases alone)."""
    from tasks import all_tasks, get_task

    chosen = [get_task(n) for n in task_names] if task_names else all_tasks()
    if dtypes:
        chosen = [t for t in (_only_dtypes(t, dtypes) for t in chosen) if t is not None]
    names = {t.name for t in chosen}
    by_name = {t.name: t for t in chosen}
    kernels = []
    if "solutions" in corpora:
        kernels += [(f"{t.name}/solution", t if dtypes else t.name, "all", t.solution_source())
                    for t in chosen]
    if "honest" in corpora:
        from tests.test_honest_styles import KERNELS

        for stem, task in KERNELS:
            if task in names:
                kernels.append((f"honest/{stem}", by_name[task] if dtypes else task, "all",
                                (ROOT / "tests" / "honest" / f"{stem}.py").read_text()))
    if "thirdparty" in corpora:
        from tests.thirdparty import CORPUS, build_source

        for entry in CORPUS:
            if entry.task in names:
                task = get_task(entry.task)  # only the dtypes the kernel is expected to handle
                task = _only_dtypes(task, [d for d in entry.dtypes_expected_correct
                                           if not dtypes or d in dtypes])
                if task is None:
                    continue
                for split in entry.splits_expected_correct:
                    kernels.append((f"thirdparty/{entry.name}", task, split, build_source(entry)))
    return kernels


def _only_dtypes(task: Any, dtypes: list[str]) -> Any | None:
    """The task with only the cases of these dtypes; None where that leaves a split without
    a check case (Task refuses to exist so)."""
    try:
        return dataclasses.replace(task, cases=tuple(c for c in task.cases if c.dtype in dtypes))
    except ValueError:
        return None


def measure(kernels: list[tuple[str, Any, str, str]], n_seeds: int, workers: int, base_seed: int,
            tpu_numerics: bool) -> list[Margin]:
    from rich.progress import Progress

    from evaluator.grader import Evaluator, Job

    margins: dict[tuple[str, str, str], Margin] = {}
    jobs = [Job(task, source, split, base_seed) for _, task, split, source in kernels]
    labels = {id(job): label for job, (label, *_) in zip(jobs, kernels)}
    with Evaluator(workers=workers, n_seeds=n_seeds, tpu_numerics=tpu_numerics) as ev, Progress() as bar:
        progress = bar.add_task(f"grading on {n_seeds} seeds", total=len(jobs))
        verdicts = ev.grade_many(jobs, on_done=lambda v: bar.advance(progress))
    for job, verdict in zip(jobs, verdicts):
        label = labels[id(job)]
        if not verdict.cases:
            margins[(label, verdict.task, "-")] = Margin(label, verdict.task, "-", float("inf"), 0,
                                                         [f"{verdict.status}: {verdict.message[:120]}"])
            continue
        for case in verdict.cases:
            m = margins.setdefault((label, verdict.task, case.dtype), Margin(label, verdict.task, case.dtype))
            m.cases += 1
            m.worst_ratio = max(m.worst_ratio, case.bound_ratio or 0.0)
            m.worst_rel_l2 = max(m.worst_rel_l2, case.rel_l2_err or 0.0)
            if case.status != "correct":
                m.failed_cases.append(f"{case.name}: {case.status}")
    return sorted(margins.values(), key=lambda m: -m.worst_ratio)


def print_table(margins: list[Margin], n_seeds: int) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"worst error / bound over {n_seeds} seeds per case (1.0 = at the tolerance)")
    for col in ("kernel", "task", "dtype", "cases", "worst / bound", "worst rel L2", "flipping cases"):
        table.add_column(col)
    for m in margins:
        style = "red" if m.flips or m.worst_ratio >= 0.7 else None
        table.add_row(m.kernel, m.task, m.dtype, str(m.cases), f"{m.worst_ratio:.3f}", f"{m.worst_rel_l2:.3g}",
                      "; ".join(m.failed_cases[:2]) or "-", style=style)
    Console().print(table)
    over = [m for m in margins if m.worst_ratio >= 0.7]
    print(f"{len(margins)} (kernel, dtype) pairs; {sum(m.flips > 0 for m in margins)} with a failing "
          f"case; {len(over)} with worst error >= 0.7 of the bound")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, default=20, help="input seeds per case (default %(default)s)")
    p.add_argument("--task", action="append", help="only this task (repeatable)")
    p.add_argument("--corpus", action="append", choices=("solutions", "honest", "thirdparty"),
                   help="which honest kernels (repeatable; default: solutions)")
    p.add_argument("--dtype", action="append", help="only cases of this dtype (repeatable)")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--base-seed", type=int, default=20261130)
    p.add_argument("--exact-dots", action="store_true", help="grade with exact f32 dots (the old numerics)")
    p.add_argument("--json", type=Path, help="also write the margins here")
    args = p.parse_args(argv)
    start = time.perf_counter()
    kernels = honest_kernels(args.corpus or ["solutions"], args.task, args.dtype)
    margins = measure(kernels, args.seeds, args.workers, args.base_seed, not args.exact_dots)
    print_table(margins, args.seeds)
    print(f"{len(kernels)} kernels graded in {time.perf_counter() - start:.0f} s")
    if args.json:
        args.json.write_text(json.dumps([{**m.__dict__, "flips": m.flips} for m in margins], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
