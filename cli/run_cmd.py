"""`run`: grade one candidate and print its verdict."""
from __future__ import annotations

import argparse
import json

from rich.markup import escape
from rich.table import Table

from cli.options import add_common_options, console, make_evaluator, open_resolver, read_candidate, resolve_tasks
from evaluator.record import Verdict


def add_parser(sub) -> None:
    """Register the subcommand on `sub` (the subparsers of python -m evaluator)."""
    r = sub.add_parser("run", help="grade one candidate")
    r.add_argument("--task", required=True)
    r.add_argument("--candidate", required=True, help="a .py file, or a model answer with a ```python block")
    r.add_argument("--split", choices=("train", "heldout", "all"), default="train")
    add_common_options(r)
    r.set_defaults(func=cmd_run)


def cmd_run(args: argparse.Namespace) -> int:
    answer = read_candidate(args.candidate)
    with open_resolver(args.suite) as resolver:
        task = resolve_tasks(resolver, [args.task])[0]
        with make_evaluator(args, selected=[task]) as ev:
            verdict = ev.grade(task, answer, split=args.split, seed=args.seed)
    if args.json:
        print(json.dumps(verdict.to_dict(), indent=2))
    else:
        _print_verdict(verdict)
    return 0


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
    if v.predicted_speedup is not None:
        p = v.predicted_speedup
        cases = "; ".join(f"{name}: kernel {c['kernel_s'] * 1e3:.3g} ms vs XLA {c['xla_s'] * 1e3:.3g} ms "
                          f"({c['bound']}-bound)" for name, c in p["cases"].items())
        console.print(f"predicted speedup over XLA on {p['generation']}: {p['overall']:.2f}x [dim]({p['label']}: "
                      f"{escape(p['method'])}; {escape(cases)})[/]")
    if "perf_estimate" in v.details:
        console.print(escape(v.details["perf_estimate"]) + " [dim](an estimate, not a measurement)[/]")


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.3g}"
