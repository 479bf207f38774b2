"""Command line: `python -m evaluator tasks|run|check-solutions|check-suite|estimate|tune`
(stable: scripts rely on it).

Exit codes: 0 when a verdict was reached (whatever it is), 2 for a usage error (unknown
task, missing file), 1 from check-solutions when a reference solution is not correct.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from evaluator.backends import BACKENDS
from evaluator.hardware import DEFAULT_GENERATION, GENERATIONS, MiB
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
    add_suite_option(t)
    t.add_argument("--load", action="store_true",
                   help="with --suite: build every entry not in the load cache (their code runs in the "
                        "sandbox: minutes for a whole checkout) and cache what it shows; without it, "
                        "entries are listed at once, their loads from the cache")
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

    u = sub.add_parser("tune", help="search a kernel's block sizes with the static model")
    u.add_argument("--task", required=True)
    u.add_argument("--candidate", required=True, help="a .py file, or a model answer with a ```python block")
    u.add_argument("--tpu", choices=tuple(GENERATIONS), default=DEFAULT_GENERATION,
                   help="generation whose VMEM budget and figures apply (default %(default)s)")
    u.add_argument("--split", choices=("train", "heldout", "all"), default="train",
                   help="cases searched (bench sizes) and checked (check sizes)")
    u.add_argument("--budget", type=float, default=110.0,
                   help="seconds of search before the best so far is verified (default %(default)g)")
    u.add_argument("--no-compile", action="store_true",
                   help="skip the libtpu confirmation even when tpu-compile is installed")
    u.add_argument("--write", action="store_true", help="rewrite the candidate file in place")
    u.add_argument("--out", help="write the tuned source to this file")
    u.add_argument("--top", type=int, default=8, help="rows of the table (default %(default)s)")
    u.add_argument("--json", action="store_true", help="print the result as JSON")
    u.set_defaults(func=cmd_tune)
    return p


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--backend", choices=tuple(BACKENDS), default=None,
                   help="default: tpu on a TPU host, else tpu-interpret")
    p.add_argument("--tpu", choices=tuple(GENERATIONS), default=None,
                   help=f"TPU generation whose VMEM budget applies (default {DEFAULT_GENERATION}, "
                        "or the one an imported suite was tuned for: v6e for JAXBench)")
    p.add_argument("--seed", type=int, default=None, help="base seed (default: fresh each run)")
    p.add_argument("--timeout", type=float, default=None, help="seconds per worker step")
    p.add_argument("--json", action="store_true", help="print the verdict record(s) as JSON")
    p.add_argument("--exact-dots", action="store_true",
                   help="interpret mode: compute f32 dots in kernels exactly, not as a TPU does "
                        "at default precision (one bf16 pass)")
    add_scale_options(p)
    add_suite_option(p)


def add_suite_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--suite", metavar="KIND:PATH", default=None,
                   help="also take tasks from a peer suite's checkout: jaxbench:PATH (a clone of "
                        "JAXBench: jaxbench/<workload>, kernelbench-jax/level1|2/<problem>)")


@contextlib.contextmanager
def open_suite_option(spec: str | None):
    """The --suite checkout (None without one), closed afterwards; a bad value is a UsageError."""
    if spec is None:
        yield None
        return
    from suites import SuiteError, open_suite

    try:
        suite = open_suite(spec)
    except SuiteError as exc:
        raise UsageError(str(exc)) from None
    with suite:
        yield suite


def suite_tasks(suite, names: list[str] | None) -> list:
    """Tasks by name, imported ones from the suite (built on first use); every loadable one of
    the suite when no names are given (those that cannot load are said on stderr)."""
    import tasks
    from suites import LoadError

    if not names:
        names = suite.names()
        with console.status(f"loading {len(names)} tasks from {suite.root}"):
            loaded = []
            for name in names:
                try:
                    loaded.append(suite.task(name))
                except LoadError as exc:
                    print(f"not loaded: {name}: {exc}", file=sys.stderr)
        return loaded
    found = []
    for name in names:
        try:
            found.append(suite.task(name) if name in suite.entries else tasks.get_task(name))
        except LoadError as exc:
            raise UsageError(f"cannot load {name} from {suite.root}: {exc}") from None
        except tasks.UnknownTaskError as exc:
            raise UsageError(str(exc)) from None
    return found


def generation_for(requested: str | None, selected: list) -> str:
    """--tpu if given, else the generation the selected tasks were tuned for (when they agree),
    else the default."""
    if requested:
        return requested
    wanted = {t.tpu for t in selected if t.tpu}
    return wanted.pop() if len(wanted) == 1 else DEFAULT_GENERATION


def add_scale_options(p: argparse.ArgumentParser) -> None:
    """--ray and --cache: the same two options on every command that grades many candidates."""
    p.add_argument("--ray", metavar="ADDRESS", default=None,
                   help="grade on a Ray cluster: auto, ray://HOST:10001, or local (a private one); "
                        "--workers becomes the number of actors. Needs pip install -e '.[ray]'")
    p.add_argument("--cache", metavar="DIR", type=Path, default=None,
                   help="verdict cache folder: a candidate graded before with the same settings is not "
                        "graded again (its verdict comes back marked cached)")


def scale_kwargs(args: argparse.Namespace) -> dict[str, object]:
    """Evaluator keyword arguments for --ray and --cache."""
    return {"executor": "ray" if args.ray else "local", "address": args.ray, "cache": args.cache}


def _evaluator(args: argparse.Namespace, workers: int = 1, selected: list = ()):
    from evaluator.grader import Evaluator
    from evaluator.sandbox import Limits

    limits = Limits() if args.timeout is None else Limits(step_timeout_s=args.timeout)
    if args.suite and args.ray:
        raise UsageError("--suite with --ray is not supported: Ray actors cannot load the suite's tasks yet")
    try:
        return Evaluator(backend=args.backend, workers=workers, limits=limits,
                         generation=generation_for(args.tpu, list(selected)),
                         tpu_numerics=not args.exact_dots, **scale_kwargs(args))
    except ValueError as exc:  # e.g. tpu-compile without libtpu installed
        raise UsageError(str(exc)) from None


def _resolve_tasks(names: list[str] | None, suite=None):
    import tasks

    if suite is not None:
        return suite_tasks(suite, names)
    try:
        return [tasks.get_task(n) for n in names] if names else tasks.all_tasks()
    except tasks.UnknownTaskError as exc:
        raise UsageError(str(exc)) from None


def cmd_tasks(args: argparse.Namespace) -> int:
    if args.suite is None:
        if args.load:
            raise UsageError("--load needs --suite KIND:PATH")
        return _list_tasks(args, _resolve_tasks(None))
    with open_suite_option(args.suite) as imported:
        if args.load:
            _load_all(imported)
        return _list_suite(args, imported)


def _load_all(suite) -> None:
    """Build every entry the load cache lacks (this fills it), one line per entry on stderr."""
    from suites import LoadError
    from suites.listing import lookup

    names = suite.names()
    start = time.perf_counter()
    for i, name in enumerate(names, 1):
        step = f"[{i:{len(str(len(names)))}}/{len(names)}]"
        t0 = time.perf_counter()
        record = lookup(suite.entry(name))
        how = "cached"
        if record is None:
            with contextlib.suppress(LoadError):
                suite.task(name)
            how = f"{time.perf_counter() - t0:.1f} s"
        record = suite.records.setdefault(name, record)
        why = f": {' '.join(record.why_not.split())[:200]}" if not record.loaded else ""
        print(f"{step} {'loaded' if record.loaded else 'not loaded'}: {name}{why} ({how})", file=sys.stderr)
    print(f"{len(names)} entries in {time.perf_counter() - start:.0f} s", file=sys.stderr)


def _list_suite(args: argparse.Namespace, suite) -> int:
    """Every entry of the checkout, read without running it; loads from the cache (suites/listing.py)."""
    from suites.listing import fill_hint, list_entries, markdown

    rows = list_entries(suite.root, list(suite.entries.values()), known=suite.records)
    if args.json:
        print(json.dumps([r.to_dict() for r in rows], indent=2))
    elif args.markdown:
        print(markdown(rows))
    else:
        table = Table(title=f"{len(rows)} entries in {suite.root}")
        for col in ("task", "kind", "level", "file", "optimized.py", "status", "signature", "cases (train/heldout)"):
            table.add_column(col, overflow="fold", no_wrap=col == "task")
        for r in rows:
            table.add_row(r.name, r.kind, str(r.level), r.file, "yes" if r.optimized else "-",
                          escape(r.status_text()), escape(r.record.signature if r.record and r.record.signature else "-"),
                          r.cases_text())
        console.print(table)
    hint = fill_hint(args.suite, rows)
    if hint:
        print(hint, file=sys.stderr)
    return 0


def _list_tasks(args: argparse.Namespace, suite: list) -> int:
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


def _read_candidate(name: str) -> str:
    path = Path(name)
    if not path.is_file():
        raise UsageError(f"candidate file not found: {path}")
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read {path}: {exc}") from None


def cmd_run(args: argparse.Namespace) -> int:
    answer = _read_candidate(args.candidate)
    with open_suite_option(args.suite) as imported:
        task = _resolve_tasks([args.task], imported)[0]
        with _evaluator(args, selected=[task]) as ev:
            verdict = ev.grade(task, answer, split=args.split, seed=args.seed)
    if args.json:
        print(json.dumps(verdict.to_dict(), indent=2))
    else:
        _print_verdict(verdict)
    return 0


def cmd_check_solutions(args: argparse.Namespace) -> int:
    with open_suite_option(args.suite) as imported:
        return _check_solutions(args, _resolve_tasks(args.task, imported))


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

    with _evaluator(args, workers=max(1, args.workers), selected=suite) as ev:
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
    from suites import attempts as att
    from suites import attempts_report as rep
    from suites.jaxbench import TUNED_FOR

    with open_suite_option(args.suite) as imported:
        available = att.models(imported.root)
        unknown = [m for m in args.attempts if m not in available]
        if unknown or not available:
            raise UsageError(f"no generated kernels of {', '.join(unknown) or 'any model'} under "
                             f"{imported.root / att.GENERATED} (models: {', '.join(available) or 'none'})")
        attempts = att.discover(imported.root, args.attempts or available)
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


def cmd_estimate(args: argparse.Namespace) -> int:
    from evaluator.grader import Evaluator, Job
    from evaluator.perf_model import worst_bench_case

    suite = _resolve_tasks(args.task)
    if args.candidate and len(suite) != 1:
        raise UsageError("--candidate needs exactly one --task")
    answers = {t.name: _read_candidate(args.candidate) if args.candidate else t.solution_source()
               for t in suite}
    generations = args.tpu or ["v5e", "v6e"]
    rows: dict[str, dict] = {t.name: {"task": t.name} for t in suite}
    for gen in generations:
        with Evaluator(backend="tpu-interpret", workers=max(1, args.workers), generation=gen) as ev:
            jobs = [Job(t, answers[t.name], args.split, through="estimate") for t in suite]
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


def cmd_tune(args: argparse.Namespace) -> int:
    from evaluator.extract import ExtractionError, extract_code
    from evaluator.grader import Evaluator
    from evaluator.tune import TuneError, libtpu_installed, tune

    task = _resolve_tasks([args.task])[0]
    try:
        source = extract_code(_read_candidate(args.candidate))
    except ExtractionError as exc:
        raise UsageError(f"{args.candidate}: {exc}") from None
    from evaluator.knobs import find_knobs

    try:
        knobs = find_knobs(source)
    except SyntaxError as exc:
        raise UsageError(f"{args.candidate} does not parse: {exc}") from None
    if not knobs:
        raise UsageError(f"no block-size knobs found in {args.candidate}: name module-level "
                         "constants like BLOCK_M = 512, or mark one with '# tune'")
    compile_check = libtpu_installed() and not args.no_compile
    err = Console(stderr=True, highlight=False)
    if not args.json:
        err.print(f"tuning {task.name} on {args.tpu}: knobs "
                  + ", ".join(f"{k.name}={k.value}" for k in knobs)
                  + f"; budget {args.budget:g} s" + ("; libtpu confirms the winner" if compile_check else ""))

    def progress(n: int, trial) -> None:
        if not args.json:
            figs = f"{trial.slowdown:.2f}x ideal" if trial.ok else trial.status
            err.print(f"  [{n:3d}] {_setting_text(trial.setting)}: {figs}", highlight=False)

    with Evaluator(backend="tpu-interpret", generation=args.tpu) as ev:
        compile_ev = Evaluator(backend="tpu-compile", generation=args.tpu) if compile_check else None
        try:
            result = tune(task, source, ev, split=args.split, budget_s=args.budget,
                          compile_evaluator=compile_ev, progress=progress)
        except TuneError as exc:
            raise UsageError(str(exc).splitlines()[0]) from None
        finally:
            if compile_ev is not None:
                compile_ev.close()
    for path in ([args.candidate] if args.write else []) + ([args.out] if args.out else []):
        Path(path).write_text(result.source)
    if args.json:
        print(json.dumps({"task": result.task, "generation": result.generation,
                          "knobs": [k.name for k in result.knobs],
                          "baseline": dataclasses.asdict(result.baseline),
                          "best": dataclasses.asdict(result.best), "verified": result.verified,
                          "trials": [dataclasses.asdict(t) for t in result.trials],
                          "elapsed_s": result.elapsed_s, "source": result.source}, indent=2))
        return 0
    table = Table(title=f"{task.name} on {result.generation}: {len(result.trials)} settings in "
                        f"{result.elapsed_s:.0f} s" + (" (budget spent)" if result.budget_exhausted else ""))
    for col in ("setting", "MiB moved", "estimate ms", "x ideal", "VMEM MiB", "status"):
        table.add_column(col)
    shown = result.trials[:args.top]
    if result.baseline not in shown:
        shown.append(result.baseline)
    for t in shown:
        mark = " (given)" if t is result.baseline else " (chosen)" if t is result.best else ""
        table.add_row(_setting_text(t.setting) + mark, *(
            [f"{t.hbm_bytes / MiB:,.0f}", f"{t.time_s * 1e3:.3g}", f"{t.slowdown:.2f}"] if t.ok
            else ["-", "-", "-"]), f"{t.vmem_bytes / MiB:.1f}", t.status if not t.ok else "ok")
    console.print(table)
    for trial, why in result.rejected:
        console.print(f"rejected {_setting_text(trial.setting)}: {escape(why[:300])}")
    console.print(f"chosen: {_setting_text(result.best.setting)}, {result.best.slowdown:.2f}x the "
                  f"ideal (given: {result.baseline.slowdown:.2f}x); {result.verified}")
    if not (args.write or args.out):
        console.print("\n# the tuned source\n" + escape(result.source), soft_wrap=True)
    return 0


def _setting_text(setting: dict[str, int]) -> str:
    return ", ".join(f"{k}={v}" for k, v in setting.items())


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
