"""Time to grade a correct kernel: every task's own solution, graded once by one warm evaluator.

    python benchmarks/grading_time.py [--split train] [--task NAME ...] [--baseline REV]

Prints, per solution, its verdict, wall time and the run stage's share, then the median. With
`--baseline REV` the same measurement runs first on a git worktree of REV (its own evaluator
and solutions, in a subprocess), and the table sets the two side by side with their ratio: the
before/after of a grader change, measured in one run on one machine. Timings on shared cores
are noisy: compare figures from one run, medians over many tasks.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import baseline  # benchmarks/baseline.py: this file's directory is on the path when it runs

# A baseline run may run this file on an older tree: that tree is what it imports.
ROOT = baseline.root(__file__)
sys.path.insert(0, str(ROOT))


def measure(split: str, names: list[str] | None, seed: int) -> dict[str, dict]:
    """{task: {status, wall_s, run_s}} for each solution, graded in turn by one evaluator."""
    from rich.progress import track

    from evaluator.grader import Evaluator
    from tasks import all_tasks, get_task

    tasks = [get_task(n) for n in names] if names else all_tasks()
    out = {}
    with Evaluator(workers=1) as evaluator:
        evaluator.grade(tasks[0], tasks[0].solution_source(), split=split, seed=seed)  # warm-up
        for task in track(tasks, description=f"grading {len(tasks)} solutions", transient=True):
            verdict = evaluator.grade(task, task.solution_source(), split=split, seed=seed)
            run_s = sum(t.seconds for t in verdict.stage_timings if t.stage == "run")
            out[task.name] = {"status": verdict.status, "wall_s": verdict.wall_s, "run_s": run_s,
                              "cases": len(verdict.cases)}
    return out


def measure_at(rev: str, args: argparse.Namespace) -> dict[str, dict]:
    """The same measurement on a worktree of `rev`, in its own process (its own imports)."""
    extra = [a for name in args.tasks or [] for a in ("--task", name)]
    return baseline.run_at(rev, __file__, ["--split", args.split, "--seed", str(args.seed), *extra])


def table(now: dict[str, dict], before: dict[str, dict] | None) -> str:
    head = "| task | status | cases | wall s | run s |" + (" before: status | cases | wall s | ratio |" if before else "")
    rows = [head, "|" + "---|" * (head.count("|") - 1)]
    for name, t in now.items():
        row = f"| {name} | {t['status']} | {t['cases']} | {t['wall_s']:.1f} | {t['run_s']:.1f} |"
        if before and name in before:
            b = before[name]
            row += f" {b['status']} | {b['cases']} | {b['wall_s']:.1f} | {t['wall_s'] / b['wall_s']:.2f} |"
        rows.append(row)
    correct = [t["wall_s"] for t in now.values() if t["status"] == "correct"]
    lines = ["\n".join(rows), f"\nmedian wall time of a correct grading: {statistics.median(correct):.1f} s "
             f"({len(correct)} of {len(now)} correct)"]
    if before:
        was = [b["wall_s"] for b in before.values() if b["status"] == "correct"]
        lines.append(f"before: {statistics.median(was):.1f} s ({len(was)} of {len(before)} correct); "
                     f"ratio of medians {statistics.median(correct) / statistics.median(was):.2f}")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--split", default="train", choices=("train", "heldout", "all"))
    p.add_argument("--task", dest="tasks", action="append")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--baseline", metavar="REV", help="also measure this git revision, first")
    p.add_argument("--json", type=Path, help="write the measurement here (no table)")
    args = p.parse_args()
    before = measure_at(args.baseline, args) if args.baseline else None
    now = measure(args.split, args.tasks, args.seed)
    if args.json:
        args.json.write_text(json.dumps(now))
        return
    print(table(now, before))


if __name__ == "__main__":
    main()
