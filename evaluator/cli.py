"""Command line: `python -m evaluator tasks|run|check-solutions` (stable: scripts rely on it).

Exit codes: 0 when a verdict was reached (whatever it is), 2 for a usage error (unknown
task, missing file), 1 from check-solutions when a reference solution is not correct.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from evaluator.backends import BACKENDS
from evaluator.hardware import DEFAULT_GENERATION, GENERATIONS
from evaluator.record import Verdict

console = Console(highlight=False, width=None if sys.stdout.isatty() else 160)


class UsageError(Exception):
    """A mistake in how the command was called: one line on stderr, exit 2."""


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return args.func(args)
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m evaluator",
                                description="Grade Pallas TPU kernels against the task suite.")
    sub = p.add_subparsers(dest="command", required=True)

    t = sub.add_parser("tasks", help="list the tasks")
    t.add_argument("--json", action="store_true", help="print JSON instead of a table")
    t.add_argument("--markdown", action="store_true", help="print the suite table as Markdown")
    t.set_defaults(func=cmd_tasks)

    r = sub.add_parser("run", help="grade one candidate")
    r.add_argument("--task", required=True)
    r.add_argument("--candidate", required=True, help="a .py file, or a model answer with a ```python block")
    r.add_argument("--split", choices=("train", "heldout", "all"), default="train")
    _add_common(r)
    r.set_defaults(func=cmd_run)

    c = sub.add_parser("check-solutions", help="grade every task's hand-written solution")
    c.add_argument("--task", action="append", default=None, help="only this task (repeatable)")
    c.add_argument("--split", choices=("train", "heldout", "all"), default="all")
    c.add_argument("--workers", type=int, default=2, help="worker processes grading in parallel")
    _add_common(c)
    c.set_defaults(func=cmd_check_solutions)
    return p


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--backend", choices=tuple(BACKENDS), default=None,
                   help="default: tpu on a TPU host, else tpu-interpret")
    p.add_argument("--tpu", choices=tuple(GENERATIONS), default=DEFAULT_GENERATION,
                   help="TPU generation whose VMEM budget applies (default %(default)s)")
    p.add_argument("--seed", type=int, default=None, help="base seed (default: fresh each run)")
    p.add_argument("--timeout", type=float, default=None, help="seconds per worker step")
    p.add_argument("--json", action="store_true", help="print the verdict record(s) as JSON")
    p.add_argument("--exact-dots", action="store_true",
                   help="interpret mode: compute f32 dots in kernels exactly, not as a TPU does "
                        "at default precision (one bf16 pass)")


def _evaluator(args: argparse.Namespace, workers: int = 1):
    from evaluator.grader import Evaluator
    from evaluator.sandbox import Limits

    limits = Limits() if args.timeout is None else Limits(step_timeout_s=args.timeout)
    try:
        return Evaluator(backend=args.backend, workers=workers, limits=limits, generation=args.tpu,
                         tpu_numerics=not args.exact_dots)
    except ValueError as exc:  # e.g. tpu-compile without libtpu installed
        raise UsageError(str(exc)) from None


def _resolve_tasks(names: list[str] | None):
    import tasks

    try:
        return [tasks.get_task(n) for n in names] if names else tasks.all_tasks()
    except tasks.UnknownTaskError as exc:
        raise UsageError(str(exc)) from None


def cmd_tasks(args: argparse.Namespace) -> int:
    suite = _resolve_tasks(None)
    if args.json:
        print(json.dumps([t.summary() for t in suite], indent=2))
        return 0
    if args.markdown:
        print("| task | level | computes | signature | required features | held-out task |")
        print("|---|---|---|---|---|---|")
        for t in suite:
            print(f"| `{t.name}` | {t.level} | {t.description} | `{t.signature}` | "
                  f"{', '.join(f'`{f}`' for f in t.required_features) or '-'} | "
                  f"{'yes' if t.heldout_task else '-'} |")
        return 0
    table = Table(title=f"{len(suite)} tasks")
    for col in ("task", "level", "signature", "dtypes", "features", "cases (train/heldout)"):
        table.add_column(col)
    for t in suite:
        s = t.summary()["cases"]
        table.add_row(t.name, str(t.level), escape(t.signature), ", ".join(t.dtypes),
                      ", ".join(t.required_features) or "-",
                      f"{s['train/check']}+{s['train/bench']} / {s['heldout/check']}+{s['heldout/bench']}")
    console.print(table)
    console.print("cases: check-size + bench-size; check sizes run, bench sizes are traced and lowered.")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    task = _resolve_tasks([args.task])[0]
    path = Path(args.candidate)
    if not path.is_file():
        raise UsageError(f"candidate file not found: {path}")
    try:
        answer = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read {path}: {exc}") from None
    with _evaluator(args) as ev:
        verdict = ev.grade(task, answer, split=args.split, seed=args.seed)
    if args.json:
        print(json.dumps(verdict.to_dict(), indent=2))
    else:
        _print_verdict(verdict)
    return 0


def cmd_check_solutions(args: argparse.Namespace) -> int:
    from evaluator.grader import Job

    suite = _resolve_tasks(args.task)
    jobs = [Job(t.name, t.solution_source(), args.split, args.seed) for t in suite]
    start = time.perf_counter()
    if not args.json:
        console.print(f"grading {len(jobs)} reference solutions on split {args.split!r} "
                      f"with {args.workers} workers...")

    def progress(v: Verdict) -> None:
        if not args.json:
            mark = "[green]ok[/]" if v.ok else f"[red]{v.status}[/]"
            console.print(f"  {v.task:<24} {mark}  ({len(v.cases)} cases, {v.wall_s:.1f} s)")

    with _evaluator(args, workers=max(1, args.workers)) as ev:
        ev.warm_up()
        verdicts = ev.grade_many(jobs, on_done=progress)
    failed = [v for v in verdicts if not v.ok]
    if args.json:
        print(json.dumps([v.to_dict() for v in verdicts], indent=2))
    else:
        for v in failed:
            console.print(f"[red]{v.task}[/]: {escape(v.message)}")
        console.print(f"{len(verdicts) - len(failed)}/{len(verdicts)} solutions correct "
                      f"in {time.perf_counter() - start:.0f} s")
    return 1 if failed else 0


def _print_verdict(v: Verdict) -> None:
    color = "green" if v.ok else "red"
    console.print(f"[bold {color}]{v.status}[/] ({v.task} v{v.task_version}, split {v.split}, "
                  f"backend {v.backend}, {v.wall_s:.1f} s)")
    console.print(escape(v.message))
    if v.cases:
        table = Table()
        for col in ("case", "status", "rel L2 err", "max abs err", "run s"):
            table.add_column(col)
        for c in v.cases:
            table.add_row(c.name, c.status, _fmt(c.rel_l2_err), _fmt(c.max_abs_err), _fmt(c.run_s))
        console.print(table)
    if v.speedup is not None:
        console.print(f"speedup over XLA: {v.speedup:.2f}x")
    if "perf_estimate" in v.details:
        console.print(escape(v.details["perf_estimate"]) + " [dim](an estimate, not a measurement)[/]")


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.3g}"
