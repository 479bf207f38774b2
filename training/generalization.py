"""Kernel-level generalization: do kernels that pass the train shapes also pass the held-out ones?

    python -m training.generalization --samples runs/rebench/samples.jsonl   # a re-benchmark's kernels
    python -m training.generalization --solutions                             # our solutions (baseline)

Takes every kernel graded correct on train cases, grades it again on the held-out cases
(non-power-of-two and ragged dims, batch 1, other head dims...), and reports per task the share
that still passes and the statuses of the rest. The model-level view is
`python -m training.rebench --split heldout`.
"""
from __future__ import annotations

import argparse
import json
import sys
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any


def train_correct_kernels(path: Path) -> list[tuple[str, str, str]]:
    """(model, task, answer) for the samples of a train-split re-benchmark that were correct."""
    if not path.is_file():
        raise FileNotFoundError(f"samples file not found: {path}")
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [(r["model"], r["task"], r["answer"]) for r in rows if r["split"] == "train" and r["status"] == "correct"]


def solution_kernels(names: list[str] | None) -> list[tuple[str, str, str]]:
    from tasks import all_tasks, get_task

    tasks = [get_task(n) for n in names] if names else [t for t in all_tasks() if not t.heldout_task]
    return [("solutions", t.name, t.solution_source()) for t in tasks]


def regrade(kernels: list[tuple[str, str, str]], workers: int) -> dict[str, Any]:
    from evaluator.grader import Evaluator, Job

    with Evaluator(workers=workers) as evaluator:
        verdicts = evaluator.grade_many([Job(task, answer, "heldout") for _, task, answer in kernels])
    per: dict[tuple[str, str], Counter] = defaultdict(Counter)
    reasons: dict[tuple[str, str], list[str]] = defaultdict(list)
    for (model, task, _), verdict in zip(kernels, verdicts):
        per[(model, task)][verdict.status] += 1
        if not verdict.ok:
            reasons[(model, task)].append(verdict.message[:300])
    report: dict[str, Any] = defaultdict(dict)
    for (model, task), counts in sorted(per.items()):
        n = sum(counts.values())
        report[model][task] = {"kernels": n, "still_pass": counts["correct"] / n,
                               "failures": {s: c for s, c in counts.items() if s != "correct"},
                               "examples": reasons[(model, task)][:2]}
    return dict(report)


def main(argv: list[str] | None = None) -> int:
    from rich.console import Console
    from rich.table import Table

    p = argparse.ArgumentParser(prog="python -m training.generalization", description=__doc__.split("\n")[0])
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--samples", type=Path, help="samples.jsonl of a train-split `training.rebench` run")
    source.add_argument("--solutions", action="store_true", help="the tasks' own solutions")
    p.add_argument("--task", dest="tasks", action="append")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--out", type=Path, default=Path("runs/generalization.json"))
    args = p.parse_args(argv)
    try:
        kernels = solution_kernels(args.tasks) if args.solutions else train_correct_kernels(args.samples)
    except (FileNotFoundError, KeyError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.tasks:
        kernels = [k for k in kernels if k[1] in args.tasks]
    if not kernels:
        print("error: no kernel was correct on the train cases: nothing to re-grade", file=sys.stderr)
        return 2
    report = regrade(kernels, args.workers)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))
    table = Table(title="Kernels correct on train shapes, re-graded on held-out shapes")
    for column in ("model", "task", "kernels", "still pass", "why the rest fail"):
        table.add_column(column)
    for model, tasks in report.items():
        for task, row in tasks.items():
            table.add_row(model, task, str(row["kernels"]), f"{100 * row['still_pass']:.0f}%",
                          ", ".join(f"{s} {c}" for s, c in row["failures"].items()) or "-")
    Console().print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
