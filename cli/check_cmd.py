"""`check-solutions` (every task's reference solution) and `check-suite` (a peer suite's own
files, or with --attempts its model-written kernels beside its own verdicts)."""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from cli.options import (UsageError, add_common_options, console, make_evaluator, model_attempts, open_resolver,
                         open_suite_option, resolve_tasks)
from evaluator.performance.hardware import GENERATIONS
from evaluator.record import Verdict


def add_parser(sub) -> None:
    """Register check-solutions and check-suite on `sub` (the subparsers of python -m evaluator)."""
    c = sub.add_parser("check-solutions", help="grade every task's hand-written solution")
    c.add_argument("--task", action="append", default=None, help="only this task (repeatable)")
    c.add_argument("--split", choices=("train", "heldout", "all"), default="all")
    c.add_argument("--workers", type=int, default=2, help="worker processes grading in parallel")
    add_common_options(c)
    c.set_defaults(func=cmd_check_solutions)

    k = sub.add_parser("check-suite", help="load a peer suite's checkout and grade its own files")
    k.add_argument("suite", metavar="KIND:PATH", help="e.g. jaxbench:~/JAXBench (a clone of JAXBench)")
    k.add_argument("--task", action="append", default=None, help="only this entry (repeatable)")
    k.add_argument("--workers", type=int, default=2, help="worker processes grading in parallel")
    k.add_argument("--json", action="store_true", help="print the rows and summary as JSON")
    k.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    k.add_argument("--tpu", choices=tuple(GENERATIONS), default=None,
                   help="TPU generation (default: the one the suite was tuned for, v6e for JAXBench)")
    k.add_argument("--seed", type=int, default=0, help="base seed of the gradings (default %(default)s)")
    k.add_argument("--attempts", nargs="*", metavar="MODEL", default=None,
                   help="grade the model-written kernels under pallas_eval/generated/MODEL (default: every "
                        "model) and compare with JAXBench's own verdicts, instead of the three gradings")
    k.add_argument("--journal", type=Path, default=Path("runs/check-suite/attempts.jsonl"),
                   help="--attempts: JSONL of finished gradings; a rerun grades only what is not in it "
                        "(default %(default)s)")
    k.set_defaults(func=cmd_check_suite)


def cmd_check_solutions(args: argparse.Namespace) -> int:
    with open_resolver(args.suite) as resolver:
        return _check_solutions(args, resolve_tasks(resolver, args.task))


def _check_solutions(args: argparse.Namespace, suite: list) -> int:
    from evaluator.grader import Job

    if args.suite:  # an imported task's solution is its optimized.py; a baseline is no solution
        without = [t.name for t in suite if t.solution_path.name != "optimized.py"]
        if without:
            console.print(f"no optimized.py, not graded: {len(without)} tasks")
        suite = [t for t in suite if t.solution_path.name == "optimized.py"]
    jobs = [Job(t, t.solution_source(), args.split, args.seed) for t in suite]
    start = time.perf_counter()
    if not args.json:
        console.print(f"grading {len(jobs)} reference solutions on split {args.split!r} "
                      f"with {args.workers} workers...")

    def progress(v: Verdict) -> None:
        if not args.json:
            mark = "[green]ok[/]" if v.ok else f"[red]{v.status}[/]"
            console.print(f"  {v.task:<24} {mark}  ({len(v.cases)} cases, {v.wall_s:.1f} s)")

    with make_evaluator(args, workers=max(1, args.workers), selected=suite) as ev:
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


def cmd_check_suite(args: argparse.Namespace) -> int:
    from evaluator.grader import Evaluator
    from suites.jaxbench import TUNED_FOR
    from suites.report import SuiteRow, check_suite, grader_lied, markdown, summary

    if args.attempts is not None:
        return _check_attempts(args)
    with open_suite_option(args.suite) as imported:
        unknown = [n for n in args.task or [] if n not in imported.entries]
        if unknown:
            raise UsageError(f"not in the suite at {imported.root}: {', '.join(unknown)}")
        names = args.task or imported.names()
        if not (args.json or args.markdown):
            console.print(f"{len(names)} entries in {imported.root}; each is loaded (their code runs "
                          "in a sandboxed worker) and three files graded: baseline, zeros, optimized.py")

        def show(row: SuiteRow) -> None:
            if args.json or args.markdown:
                return
            if not row.loaded:
                console.print(f"  {row.name:<60} [yellow]not loaded[/]: {escape(row.why_not[:200])}")
                return
            opt = f", optimized {row.optimized}" if row.optimized else ""
            fixed = f", repaired {', '.join(row.repaired)}" if row.repaired else ""
            console.print(f"  {row.name:<60} baseline {row.baseline}, zeros {row.zeros}{opt}{fixed}")

        generation = args.tpu or TUNED_FOR
        with Evaluator(backend="tpu-interpret", workers=max(1, args.workers), generation=generation) as ev:
            rows = check_suite(imported, ev, names, on_row=show, seed=args.seed)
    totals = summary(rows)
    if args.json:
        print(json.dumps({"generation": generation, "summary": totals,
                          "rows": [r.to_dict() for r in rows]}, indent=2))
    elif args.markdown:
        print(markdown(rows))
    for group, g in totals["groups"].items():
        print(f"{group}: {g['loaded']}/{g['entries']} loaded", file=sys.stderr)
    print(f"baselines refused as no_kernel: {totals['baselines_no_kernel']}/{totals['loaded']}; "
          f"zeros kernel refused: {totals['zeros_refused']}/{totals['loaded']}; inputs repaired: "
          f"{totals['repaired']}; optimized.py correct: {totals['optimized_correct']}/{totals['optimized']}",
          file=sys.stderr)
    lied = grader_lied(rows)
    if lied:
        print(f"the grader accepted a baseline or the zeros kernel: {', '.join(lied)}", file=sys.stderr)
    return 1 if lied else 0


def _check_attempts(args: argparse.Namespace) -> int:
    """check-suite --attempts: the checkout's model-written kernels, our verdicts beside theirs."""
    from rich.progress import Progress

    from evaluator.digest import evaluator_digest
    from evaluator.grader import Evaluator
    from suites import attempts as att, attempts_report as rep
    from suites.jaxbench import TUNED_FOR

    with open_suite_option(args.suite) as imported:
        attempts = model_attempts(imported.root, args.attempts)
        if args.task:
            missing = sorted(set(args.task) - {a.task for a in attempts})
            if missing:
                raise UsageError(f"no generated kernel answers {', '.join(missing)}")
            attempts = [a for a in attempts if a.task in args.task]
        generation = args.tpu or TUNED_FOR
        with Evaluator(backend="tpu-interpret", workers=max(1, args.workers), generation=generation) as ev:
            # The grader's own digest: a journal from an older grader is graded again.
            settings = {"split": "train", "seed": args.seed, "n_seeds": ev.n_seeds, "generation": generation,
                        "evaluator": evaluator_digest()}
            journal = att.Journal(args.journal, settings)
            with Progress(console=Console(stderr=True), transient=False) as bar:
                todo = bar.add_task(f"{len(attempts)} attempts", total=len(attempts))
                ours = att.grade(imported, ev, attempts, journal, args.seed, args.workers,
                                 on_done=lambda a, o, now: bar.advance(todo))
    rows = rep.rows(attempts, ours)
    graded = sum(1 for a in attempts if journal.get(a.key, a.sha256()) is not None)
    if args.json:
        print(json.dumps(rep.to_json(rows, generation), indent=2))
    else:  # the Markdown reads as plain text too
        print(rep.markdown(rows))
    for model, counts in rep.summary(rows).items():
        print(f"{model}: " + ", ".join(f"{rep.LABELS[k]} {v}" for k, v in counts.items()), file=sys.stderr)
    print(f"journal: {args.journal} ({graded} of {len(attempts)} attempts in it)", file=sys.stderr)
    return 0
