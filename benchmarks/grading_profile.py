"""Where a grading's time goes: per stage, for the 40 solutions and a sample of failing candidates.

    python benchmarks/grading_profile.py [--task NAME ...] [--failing N] [--seed 0] [--json FILE]

Every candidate is graded once by one warm evaluator (the first grading warms the worker up
and is not counted). The table splits each grading into: load (executing the module), trace
(tracing kernel() at every size and the analyses of the structure and coverage stages), the
other static checks, lower (Pallas -> Mosaic for TPU), compile (the interpret-mode program of
each case, in the worker), run (each seed's execution: the first seed with every check, the
others as the grader chose, evaluator/execution/handlers.py) and the rest of the run stage (pipes, and host work the worker did not hide). The host makes
inputs and expected outputs, and compares outputs, while the worker runs (evaluator/stages.py,
run_stage): those times are shown apart, "beside the worker", as most of them do not add to the
wall time. Shares are of the summed wall time. Timings on shared cores are noisy: compare
figures from one run.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PARTS = ("load", "trace", "static checks", "lower", "compile", "run, seed 1", "run, other seeds",
         "run stage, rest")
TRACE_STAGES = ("structure", "coverage")
STATIC_STAGES = ("extract", "policy", "index_maps", "features", "estimate")


def profile(verdict) -> dict[str, float]:
    """The wall time of one verdict, split into PARTS (+ "references" and "compare", beside the worker, and "wall")."""
    stages: dict[str, float] = {}
    for timing in verdict.stage_timings:
        stages[timing.stage] = stages.get(timing.stage, 0.0) + timing.seconds
    cases = verdict.cases
    parts = {
        "load": stages.get("load", 0.0),
        "trace": sum(stages.get(s, 0.0) for s in TRACE_STAGES),
        "static checks": sum(stages.get(s, 0.0) for s in STATIC_STAGES),
        "lower": stages.get("lowering", 0.0),
        "compile": sum(c.compile_s or 0.0 for c in cases),
        "run, seed 1": sum(c.seed_run_s[0] for c in cases if c.seed_run_s),
        "run, other seeds": sum(sum(c.seed_run_s[1:]) for c in cases),
    }
    in_worker = parts["compile"] + parts["run, seed 1"] + parts["run, other seeds"]
    parts["run stage, rest"] = max(stages.get("run", 0.0) - in_worker, 0.0)
    parts["references"] = sum(c.reference_s or 0.0 for c in cases)
    parts["compare"] = sum(c.compare_s or 0.0 for c in cases)
    parts["wall"] = verdict.wall_s
    return parts


def failing_sample(n: int) -> list[tuple[str, str, str]]:
    """(label, task, source) of up to n broken candidates of tests/candidates/ (not the ones
    that hang: they only measure the step limit)."""
    from tests.test_statuses import CASES

    folder = ROOT / "tests" / "candidates"
    return [(name, task, (folder / f"{name}.py").read_text()) for name, task, _ in CASES[:n]]


def measure(names: list[str] | None, n_failing: int, seed: int) -> dict[str, dict]:
    from rich.progress import track

    from evaluator.grader import Evaluator
    from tasks import all_tasks, get_task

    tasks = [get_task(n) for n in names] if names else all_tasks()
    jobs = [(t.name, t.name, t.solution_source(), "solution") for t in tasks]
    jobs += [(label, task, src, "failing") for label, task, src in failing_sample(n_failing)]
    out: dict[str, dict] = {}
    with Evaluator(workers=1) as evaluator:
        evaluator.grade(tasks[0], tasks[0].solution_source(), seed=seed)  # warm-up, not counted
        for label, task, source, group in track(jobs, description=f"grading {len(jobs)} candidates",
                                                transient=True):
            verdict = evaluator.grade(task, source, seed=seed)
            out[label] = {"group": group, "status": str(verdict.status), **profile(verdict),
                          "seed_checks": sorted({c for case in verdict.cases for c in case.seed_checks})}
    return out


def table(rows: dict[str, dict], group: str) -> str:
    mine = [r for r in rows.values() if r["group"] == group]
    if not mine:
        return ""
    wall = sum(r["wall"] for r in mine)
    lines = [f"### {group}: {len(mine)} gradings, {wall:.1f} s in all, median {statistics.median(r['wall'] for r in mine):.2f} s",
             "", "| part | seconds | share | median per grading |", "|---|---:|---:|---:|"]
    for part in PARTS:
        total = sum(r[part] for r in mine)
        lines.append(f"| {part} | {total:.1f} | {total / wall:.0%} | {statistics.median(r[part] for r in mine):.2f} |")
    for part in ("references", "compare"):
        total = sum(r[part] for r in mine)
        lines.append(f"| (beside the worker) {part} | {total:.1f} | | {statistics.median(r[part] for r in mine):.2f} |")
    statuses: dict[str, int] = {}
    for r in mine:
        statuses[r["status"]] = statuses.get(r["status"], 0) + 1
    lines += ["", "statuses: " + ", ".join(f"{s} {n}" for s, n in sorted(statuses.items()))]
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--task", dest="tasks", action="append", help="only these solutions (repeatable)")
    p.add_argument("--failing", type=int, default=20, help="broken candidates of tests/candidates/ to add")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path, help="also write every grading's parts here")
    args = p.parse_args()
    rows = measure(args.tasks, args.failing, args.seed)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    print("\n\n".join(t for t in (table(rows, "solution"), table(rows, "failing")) if t))


if __name__ == "__main__":
    main()
