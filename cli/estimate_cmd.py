"""`estimate`: the static performance model's figures at bench sizes (nothing runs)."""
from __future__ import annotations

import argparse
import json

from rich.table import Table

from cli.options import UsageError, console, open_resolver, read_candidate, resolve_tasks
from evaluator.performance.hardware import GENERATIONS, MiB


def add_parser(sub) -> None:
    """Register the subcommand on `sub` (the subparsers of python -m evaluator)."""
    e = sub.add_parser("estimate", help="static performance estimate at bench sizes (nothing runs)")
    e.add_argument("--task", action="append", default=None, help="only this task (repeatable)")
    e.add_argument("--candidate", help="a kernel for the one --task (default: each task's solution)")
    e.add_argument("--split", choices=("train", "heldout", "all"), default="train")
    e.add_argument("--tpu", action="append", choices=tuple(GENERATIONS), default=None,
                   help="TPU generation (repeatable; default v5e and v6e)")
    e.add_argument("--workers", type=int, default=2, help="worker processes in parallel")
    e.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    e.add_argument("--json", action="store_true", help="print the figures as JSON")
    e.set_defaults(func=cmd_estimate)


def cmd_estimate(args: argparse.Namespace) -> int:
    from evaluator.grader import Evaluator, Job
    from evaluator.performance.perf_model import worst_bench_case
    from evaluator.stages import LAST_STATIC_STAGE

    with open_resolver(None) as ours:
        suite = resolve_tasks(ours, args.task)
    if args.candidate and len(suite) != 1:
        raise UsageError("--candidate needs exactly one --task")
    answers = {t.name: read_candidate(args.candidate) if args.candidate else t.solution_source()
               for t in suite}
    generations = args.tpu or ["v5e", "v6e"]
    rows: dict[str, dict] = {t.name: {"task": t.name} for t in suite}
    for gen in generations:
        with Evaluator(backend="tpu-interpret", workers=max(1, args.workers), generation=gen) as ev:
            jobs = [Job(t, answers[t.name], args.split, through=LAST_STATIC_STAGE) for t in suite]
            for v in ev.grade_many(jobs):
                worst = worst_bench_case(v.details.get("perf_model", {}))
                row = rows[v.task]
                if worst is None:
                    row[gen] = {"status": v.status, "message": v.message}
                    continue
                case, est = worst
                row[gen] = {"status": v.status, "case": case, "time_ms": est["time_s"] * 1e3,
                            "slowdown_vs_ideal": est["slowdown_vs_ideal"],
                            "hbm_mib": est["hbm_bytes"] / MiB, "ideal_mib": est["ideal_bytes"] / MiB,
                            "grid_steps": est["grid_steps"], "bound": est["bound"]}
    if args.json:
        print(json.dumps(list(rows.values()), indent=2))
        return 0
    header = ["task"] + [f"{g} {what}" for g in generations for what in ("ms", "x ideal")] + [
        f"MiB moved ({generations[0]})", "ideal MiB", "grid steps"]
    lines = []
    for row in rows.values():
        cells = [row["task"]]
        for g in generations:
            fig = row[g]
            cells += ([f"{fig['time_ms']:.3g}", f"{fig['slowdown_vs_ideal']:.2f}"] if "time_ms" in fig
                      else [fig["status"], "-"])
        first = row[generations[0]]
        cells += ([f"{first['hbm_mib']:,.0f}", f"{first['ideal_mib']:,.0f}", f"{first['grid_steps']:,}"]
                  if "time_ms" in first else ["-", "-", "-"])
        lines.append(cells)
    if args.markdown:
        print("| " + " | ".join(header) + " |")
        print("|" + "---|" * len(header))
        for cells in lines:
            print("| " + " | ".join([f"`{cells[0]}`", *cells[1:]]) + " |")
        return 0
    table = Table(title=f"static estimate at {args.split} bench sizes, worst case per task")
    for col in header:
        table.add_column(col)
    for cells in lines:
        table.add_row(*cells)
    console.print(table)
    console.print("[dim]an estimate from the static model (docs/performance-model.md), not a measurement[/]")
    return 0
