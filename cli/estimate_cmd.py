"""`estimate`: static figures at bench sizes, nothing run: the performance model's estimate of each
kernel and its predicted speedup over XLA (docs/performance-model.md).

Our tasks: a table per task and generation (tasks/README.md's is this command's --markdown). A
peer suite (`--suite jaxbench:PATH`): one row per (task, candidate), the suite's own solutions or,
with `--attempts`, its model-written kernels; every candidate that traces gets a prediction,
whatever the static stages said of it.
"""
from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from cli.options import (UsageError, add_suite_option, console, model_attempts, open_resolver, read_candidate,
                         resolve_tasks)
from evaluator.performance.hardware import GENERATIONS, MiB

DEFAULT_CACHE = Path("runs/estimate/cache")


def add_parser(sub) -> None:
    """Register the subcommand on `sub` (the subparsers of python -m evaluator)."""
    e = sub.add_parser("estimate", help="static performance estimate and predicted speedup at bench sizes "
                                        "(nothing runs)")
    e.add_argument("--task", action="append", default=None, help="only this task (repeatable)")
    e.add_argument("--candidate", help="a kernel for the one --task (default: each task's solution)")
    e.add_argument("--split", choices=("train", "heldout", "all"), default="train")
    e.add_argument("--tpu", action="append", choices=tuple(GENERATIONS), default=None,
                   help="TPU generation (repeatable; default v5e and v6e, or the one a --suite was tuned for)")
    e.add_argument("--workers", type=int, default=2, help="worker processes in parallel")
    e.add_argument("--backend", choices=("tpu-interpret", "tpu-compile"), default="tpu-interpret",
                   help="tpu-compile: also compile each candidate with libtpu for the generation (refuses "
                        "what the TPU compiler would, and prices the glue around its kernels by XLA's cost "
                        "model of the compiled program; slower on a cold run)")
    e.add_argument("--attempts", nargs="*", metavar="MODEL", default=None,
                   help="with --suite: the checkout's model-written kernels (pallas_eval/generated/MODEL; "
                        "all models when none is named) instead of its solutions")
    e.add_argument("--cache", metavar="DIR", type=Path, default=DEFAULT_CACHE,
                   help=f"verdict cache: a rerun reads what it estimated before (default {DEFAULT_CACHE})")
    e.add_argument("--no-cache", action="store_true", help="estimate everything again, keep nothing")
    e.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    e.add_argument("--json", action="store_true", help="print one JSON line per (task, candidate, generation)")
    e.add_argument("--ship-xla-costs", action="store_true",
                   help="compile the reference of every task of ours at every bench case (both splits) for "
                        "the generations and write what XLA's cost model says to tasks/xla_costs.json, "
                        "which a fresh clone reads instead of compiling")
    add_suite_option(e)
    e.set_defaults(func=cmd_estimate)


def cmd_estimate(args: argparse.Namespace) -> int:
    if args.attempts is not None and not args.suite:
        raise UsageError("--attempts needs --suite jaxbench:PATH")
    if args.ship_xla_costs:
        if args.suite or args.task or args.candidate:
            raise UsageError("--ship-xla-costs covers every task of ours: no --suite, --task or --candidate")
        return ship_xla_costs(args.tpu or ["v5e", "v6e"], max(1, args.workers))
    with open_resolver(args.suite) as resolver:
        if args.suite:
            from suites.jaxbench import TUNED_FOR

            if args.candidate:
                raise UsageError("--candidate is for our tasks; a suite's candidates are its files (--attempts)")
            generations = args.tpu or [TUNED_FOR]
            rows = [row for gen in generations for row in _estimate_suite(args, resolver.suites[0], gen)]
        else:
            suite = resolve_tasks(resolver, args.task)
            if args.candidate and len(suite) != 1:
                raise UsageError("--candidate needs exactly one --task")
            candidates = [(t, str(args.candidate) if args.candidate else "solution",
                           read_candidate(args.candidate) if args.candidate else t.solution_source()) for t in suite]
            generations = args.tpu or ["v5e", "v6e"]
            rows = [row for gen in generations for row in _estimate(args, candidates, gen)]
    if args.json:
        for row in rows:
            print(json.dumps(row))
        return 0
    if args.suite:
        _print_suite(rows)
    else:
        _print_ours(rows, generations, args.markdown, args.split)
    return 0


def _estimate_suite(args: argparse.Namespace, suite: Any, gen: str) -> list[dict]:
    """A peer suite's solutions or attempts. Each row is kept under --cache as soon as it is
    made, keyed by the entry's file and adapter, the candidate, the grader and the settings: a
    rerun (or a run after an interrupted one) builds only the tasks of what is new and prices the
    rest again. Each task is built and its candidates estimated in one go, `--workers` tasks at a
    time, so building (their code in the sandbox) and compiling (libtpu) overlap on a cold
    checkout rather than following one another."""
    from concurrent.futures import ThreadPoolExecutor

    from evaluator.digest import evaluator_digest
    from suites import LoadError, listing

    names = args.task or suite.names()
    unknown = [n for n in names if n not in suite.entries]
    if unknown:
        raise UsageError(f"not in the suite at {suite.root}: {', '.join(unknown)}")
    if args.attempts is None:
        wanted = [(n, "solution", (suite.entries[n].optimized or suite.entries[n].path).read_text()) for n in names]
    else:
        wanted = [(a.task, a.key, a.text()) for a in model_attempts(suite.root, args.attempts) if a.task in names]
    settings = [evaluator_digest(), gen, args.split, args.backend]  # not the constants: a kept row is priced again
    store = None if args.no_cache else RowStore(args.cache / "rows")
    rows: dict[int, dict] = {}
    missing: dict[str, list[tuple[int, str, str, str]]] = {}
    for i, (name, label, text) in enumerate(wanted):
        entry = suite.entries[name]
        record = listing.lookup(entry)
        if record is not None and not record.loaded and not record.refused_when_run:
            continue  # cannot become a task, even unrun: said when it was built (`tasks --suite` lists why)
        key = RowStore.key(listing.entry_key(entry), label, text, settings)
        if store is not None and (row := store.get(key)) is not None:
            rows[i] = priced(row)
        else:
            missing.setdefault(name, []).append((i, label, text, key))
    if missing:
        with _estimator(args, gen) as (ev, bar):
            todo = bar.add_task(f"estimating {sum(map(len, missing.values()))} candidates of "
                                f"{len(missing)} tasks for {gen}", total=sum(map(len, missing.values())))

            def one(name: str) -> None:
                try:
                    task = suite.task(name, run_reference=False)  # nothing is run: static stages only
                except LoadError as exc:
                    print(f"not loaded: {name}: {exc}", file=sys.stderr)
                    bar.advance(todo, len(missing[name]))
                    return
                for i, label, text, key in missing[name]:
                    verdict, = ev.grade_many([_static_job(args, task, text)])
                    rows[i] = row = priced(prediction_row(verdict, label))
                    if store is not None:
                        store.put(key, row)
                    bar.advance(todo)

            with ThreadPoolExecutor(max(1, args.workers)) as pool:
                list(pool.map(one, missing))
    return [rows[i] for i in sorted(rows)]


# Shipping compiles each reference once, offline: it waits longer than a grading does (a decoder
# layer's reference compiles in 2-5 minutes on 2 busy cores), and retries what a grading gave up on.
SHIP_COMPILE_S = 900.0


def ship_xla_costs(generations: list[str], workers: int) -> int:
    """Compile (or read from the cache) each of our references at each bench case for each
    generation, and write the entries to the file every ReferenceCosts reads below its cache."""
    from concurrent.futures import ThreadPoolExecutor

    from rich.progress import Progress

    import tasks
    from evaluator.digest import task_digest
    from evaluator.stages import case_spec
    from evaluator.truth.xla_reference import NO_LIBTPU, SHIPPED_XLA_COSTS, ReferenceCosts

    costs = ReferenceCosts(task_digest, workers=workers, compile_s=SHIP_COMPILE_S, retry_errors=True)
    if costs.libtpu is None:
        raise UsageError(NO_LIBTPU)
    wanted = [(task, case, case_spec(task, case), GENERATIONS[gen]) for task in tasks.all_tasks()
              for case in task.select("all", "bench") for gen in generations]
    try:
        with ThreadPoolExecutor(workers) as pool, Progress(console=Console(stderr=True), transient=True) as bar:
            todo = bar.add_task(f"compiling {len(wanted)} references", total=len(wanted))

            def one(item: tuple) -> tuple[str, dict]:
                value = costs.cost(*item)
                bar.advance(todo)
                return costs.key(item[0], item[2], item[3]), costs.cache.entry(value)
            entries = dict(sorted(pool.map(one, wanted)))
    finally:
        costs.close()
    SHIPPED_XLA_COSTS.write_text(json.dumps(entries, indent=0) + "\n")
    failed = sum("error" in e for e in entries.values())
    console.print(f"wrote {len(entries)} compiled costs ({failed} compile errors) to {SHIPPED_XLA_COSTS}")
    return 0


class RowStore:
    """`estimate --suite` rows by key, one JSON file each (written whole, then renamed)."""

    def __init__(self, folder: Path):
        self.folder = folder

    @staticmethod
    def key(*parts: Any) -> str:
        return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()

    def get(self, key: str) -> dict | None:
        try:
            return json.loads((self.folder / f"{key}.json").read_text())
        except (OSError, ValueError):
            return None

    def put(self, key: str, row: dict) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        tmp = self.folder / f".{key}.tmp"
        tmp.write_text(json.dumps(row))
        tmp.replace(self.folder / f"{key}.json")


@contextlib.contextmanager
def _estimator(args: argparse.Namespace, gen: str) -> Iterator[tuple[Any, Any]]:
    """The grader `estimate` uses (every static stage, a prediction wherever a kernel traced) and
    a progress bar on stderr."""
    from rich.progress import Progress

    from evaluator.grader import Evaluator

    try:
        ev = Evaluator(backend=args.backend, workers=max(1, args.workers), generation=gen,
                       cache=None if args.no_cache else args.cache, predict_failed=True)
    except ValueError as exc:  # tpu-compile without libtpu installed
        raise UsageError(str(exc)) from None
    with ev, Progress(console=Console(stderr=True), transient=True) as bar:
        yield ev, bar


def _static_job(args: argparse.Namespace, task: Any, answer: str) -> Any:
    from evaluator.grader import Job
    from evaluator.stages import LAST_STATIC_STAGE

    return Job(task, answer, args.split, seed=0, through=LAST_STATIC_STAGE)


def _estimate(args: argparse.Namespace, candidates: list[tuple[Any, str, str]], gen: str) -> list[dict]:
    """Every static stage of each candidate, a prediction wherever it traced; one row each."""
    if not candidates:
        return []
    with _estimator(args, gen) as (ev, bar):
        todo = bar.add_task(f"estimating {len(candidates)} candidates for {gen}", total=len(candidates))
        verdicts = ev.grade_many([_static_job(args, task, answer) for task, _, answer in candidates],
                                 on_done=lambda v: bar.advance(todo))
    return [priced(prediction_row(v, label)) for v, (_, label, _) in zip(verdicts, candidates)]


def prediction_row(v: Any, candidate: str) -> dict[str, Any]:
    """What `estimate` reports of one verdict graded through the static stages."""
    passed = v.status == "pending"  # graded through the last static stage with no failure
    row: dict[str, Any] = {"task": v.task, "candidate": candidate, "generation": v.details.get("tpu_generation"),
                           "static_stages": "passed" if passed else v.status, "stage": v.stage,
                           "message": "" if passed else v.message}
    if v.predicted_speedup is not None:
        row["cases"] = {name: {"inputs": c["inputs"]} for name, c in v.predicted_speedup["cases"].items()}
    worst = max((v.details.get("perf_model") or {}).items(), key=lambda item: item[1]["slowdown_vs_ideal"],
                default=None)
    if worst is not None:
        case, est = worst
        row.update(case=case, time_ms=est["time_s"] * 1e3, slowdown_vs_ideal=est["slowdown_vs_ideal"],
                   hbm_mib=est["hbm_bytes"] / MiB, ideal_mib=est["ideal_bytes"] / MiB,
                   grid_steps=est["grid_steps"])
    return row


def priced(row: dict[str, Any]) -> dict[str, Any]:
    """The row with its predictions computed from their inputs by the constants in use (those
    fitted for XLA-priced glue where a compile gave it): rows kept from an earlier run follow a
    refit (`calibrate`) without grading again."""
    from evaluator.performance import calibration, prediction
    from evaluator.performance.hardware import GENERATIONS

    if not row.get("cases"):
        return row
    compiled = any(c["inputs"].get("glue_xla") for c in row["cases"].values())
    gen = GENERATIONS[row["generation"]]
    constants = calibration.load(compiled=compiled, generation=gen.name)
    cases = {name: prediction.predict_case(prediction.CaseInputs.from_dict(c["inputs"]), gen, constants)
             for name, c in row["cases"].items()}
    first = next(iter(cases.values()))
    overall = prediction.overall(cases, gen)
    return {**row, "kernel_ms": first.kernel_s * 1e3, "xla_ms": first.xla_s * 1e3,
            "predicted_speedup": overall.overall, "bound": first.bound, "xla_method": first.xla_method,
            "notes": first.notes, "cases": {name: {"kernel_s": c.kernel_s, "xla_s": c.xla_s, "speedup": c.speedup,
                                                   "bound": c.bound, "inputs": row["cases"][name]["inputs"]}
                                            for name, c in cases.items()}}


def _print_suite(rows: list[dict]) -> None:
    table = Table(title="predicted at the train bench size (static: nothing ran)")
    for col in ("task", "candidate", "static stages", "kernel ms", "XLA ms", "x XLA", "bound"):
        table.add_column(col)
    for r in rows:
        figures = ([f"{r['kernel_ms']:.3g}", f"{r['xla_ms']:.3g}", f"{r['predicted_speedup']:.2f}", r["bound"]]
                   if "kernel_ms" in r else ["-", "-", "-", "did not trace"])
        table.add_row(r["task"], r["candidate"], r["static_stages"], *figures)
    console.print(table)
    traced = sum(1 for r in rows if "kernel_ms" in r)
    console.print(f"{traced} of {len(rows)} candidates traced and were predicted "
                  "[dim](XLA's TPU cost model for the reference, ours for the kernels: docs/performance-model.md)[/]")


def _print_ours(rows: list[dict], generations: list[str], markdown: bool, split: str) -> None:
    by_task: dict[str, dict[str, dict]] = {}
    for r in rows:
        by_task.setdefault(r["task"], {})[r["generation"]] = r
    header = ["task"] + [f"{g} {what}" for g in generations for what in ("ms", "x ideal", "x XLA")] + [
        f"MiB moved ({generations[0]})", "ideal MiB", "grid steps"]
    lines = []
    for task, per_gen in by_task.items():
        cells = [task]
        for g in generations:
            r = per_gen[g]
            cells += ([f"{r['time_ms']:.3g}", f"{r['slowdown_vs_ideal']:.2f}",
                       f"{r['predicted_speedup']:.2f}" if "predicted_speedup" in r else "-"]
                      if "time_ms" in r else [r["static_stages"], "-", "-"])
        first = per_gen[generations[0]]
        cells += ([f"{first['hbm_mib']:,.0f}", f"{first['ideal_mib']:,.0f}", f"{first['grid_steps']:,}"]
                  if "time_ms" in first else ["-", "-", "-"])
        lines.append(cells)
    if markdown:
        print("| " + " | ".join(header) + " |")
        print("|" + "---|" * len(header))
        for cells in lines:
            print("| " + " | ".join([f"`{cells[0]}`", *cells[1:]]) + " |")
        return
    table = Table(title=f"static estimate at {split} bench sizes, worst case per task; x XLA: predicted speedup")
    for col in header:
        table.add_column(col)
    for cells in lines:
        table.add_row(*cells)
    console.print(table)
    console.print("[dim]estimates from the static model and XLA's cost model (docs/performance-model.md), "
                  "not measurements[/]")
