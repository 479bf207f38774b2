"""Build a verified Fixit repair dataset: `python -m data_gen.collect`.

    python -m data_gen.collect                                  # mutation source, no model needed
    python -m data_gen.collect --source model --base-url http://localhost:8000/v1 --model Qwen/...
    python -m data_gen.collect --source replay --replay attempts.jsonl --teacher-base-url ... --teacher M
    python -m data_gen.collect --source jaxbench:~/JAXBench --models gpt53     # real failures, repaired

Steps: 1) list work items (mutants, model prompts, replayed attempts or a checkout's generated
kernels) for the train tasks;
2) skip the ones the journal already has; 3) grade each on the evaluator (train cases only) and
repair it, journaling every result as it finishes; 4) build the dataset from the whole journal:
dedupe, decontaminate, balance, split by task, write parquet + card + figure; 5) print a summary.
"""
from __future__ import annotations

import argparse
import contextlib
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Any

from chat.context import CONTEXTS
from chat.models import EndpointError, make_chat_model
from cli.options import add_scale_options, scale_kwargs
from data_gen.failures.giveaways import structure
from data_gen.failures.operators import OPERATOR_NAMES, operator
from data_gen.pool import DEFAULT_POOL, PoolEntry, fresh_verdicts, load_pool, pool_variants
from data_gen.repairs.repair_search import DEFAULT_BUDGET
from data_gen.rows.dataset import (ContaminationError, balance, calibrate, cap_per_edit, cap_per_repair, dedupe,
                                   write_dataset)
from data_gen.rows.journal import Journal, JournalMismatch
from data_gen.rows.pairs import PromptSettings
from data_gen.sources.grading import SeededGrading
from data_gen.sources.model import ModelSource
from data_gen.sources.mutation import MutationSource
from data_gen.sources.replay import ReplaySource, Yield, checkout_items, read_replay
from evaluator.digest import evaluator_digest
from evaluator.performance.hardware import DEFAULT_GENERATION, GENERATIONS
from evaluator.record import Verdict
from tasks import UnknownTaskError, all_tasks, get_task
from tasks.spec import Task

DEFAULT_MAX_PER_TASK = 10  # 54 train tasks: 538 mutants, 6.6 minutes on 2 cores (docs/data-generation.md)
DEFAULT_BALANCE = 5
DEFAULT_MAX_PER_REPAIR = 3


SOURCES = ("mutation", "model", "replay")
CHECKOUT_KINDS = ("jaxbench",)


def source_spec(value: str) -> str:
    """--source: one of SOURCES, or KIND:PATH of a peer suite's checkout (jaxbench:~/JAXBench)."""
    kind, sep, path = value.partition(":")
    if value in SOURCES or (sep and kind in CHECKOUT_KINDS and path):
        return value
    raise argparse.ArgumentTypeError(f"choose {', '.join(SOURCES)} or jaxbench:PATH (a JAXBench checkout), "
                                     f"got {value!r}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m data_gen.collect", description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--source", type=source_spec, default="mutation",
                   help=f"{', '.join(SOURCES)}, or jaxbench:PATH: the generated kernels of a JAXBench checkout")
    p.add_argument("--name", help="dataset name (default: fixit-<source>, fixit-jaxbench for a checkout)")
    p.add_argument("--out-dir", type=Path, default=Path("datasets"), help="datasets/<name>/ is written here")
    p.add_argument("--runs-dir", type=Path, default=Path("runs"), help="journals live in <runs-dir>/<name>/")
    p.add_argument("--fresh", action="store_true", help="discard this run's journal and start over")
    p.add_argument("--task", dest="tasks", action="append", help="only this task (repeatable); held-out "
                   "tasks are refused")
    p.add_argument("--context", choices=CONTEXTS, default="none", help="hardware context in the system prompt")
    p.add_argument("--generation", choices=sorted(GENERATIONS), default=None,
                   help=f"TPU generation graded for and named in the prompt (default {DEFAULT_GENERATION}; "
                        "for a JAXBench checkout, the one it was tuned for)")
    p.add_argument("--workers", type=int, default=2, help="evaluator worker processes")
    add_scale_options(p)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--seeds", type=int, default=1, help="input seeds per case when grading (one failing "
                   "seed confirms a failure; a repair must pass every case on each)")
    p.add_argument("--balance", type=int, default=DEFAULT_BALANCE,
                   help="cap on pairs per task x failure kind (0: no cap)")
    p.add_argument("--max-per-repair", type=int, default=DEFAULT_MAX_PER_REPAIR,
                   help="cap on pairs sharing one repair kernel, up to comments, layout and names (0: no cap)")
    p.add_argument("--validation-fraction", type=float, default=0.1,
                   help="share of tasks held for the validation split (whole tasks)")
    g = p.add_argument_group("mutation source")
    g.add_argument("--operator", dest="operators", action="append", choices=OPERATOR_NAMES,
                   help="only this bug operator (repeatable)")
    g.add_argument("--max-per-task", type=int, default=DEFAULT_MAX_PER_TASK,
                   help="mutants graded per task (0: all)")
    g.add_argument("--pool", type=Path, default=DEFAULT_POOL,
                   help="verified variant pool (python -m data_gen.pool); its correct kernels are the seeds "
                        "of the mutants. Without one, each task's solution is the only seed")
    g = p.add_argument_group("replay and checkout sources")
    g.add_argument("--replay", type=Path, help="JSONL of attempts ({task, attempt[, repair, explanation, model]}) or "
                   "a training.rebench journal")
    g.add_argument("--models", nargs="+", metavar="MODEL", help="a checkout's models (pallas_eval/generated/MODEL; "
                   "default: every one)")
    g.add_argument("--budget", type=int, default=DEFAULT_BUDGET,
                   help="gradings the repair search may spend on one failing attempt (0: no search)")
    g = p.add_argument_group("model sources (and the teacher of replayed attempts)")
    g.add_argument("--model", help="served model name (with --base-url) or a local HF model directory")
    g.add_argument("--base-url", help="OpenAI-compatible endpoint, e.g. http://localhost:8000/v1 (vLLM, SGLang)")
    g.add_argument("--api-key", help="default: $OPENAI_API_KEY or EMPTY")
    g.add_argument("--teacher", help="model that repairs and explains (default: the model itself)")
    g.add_argument("--teacher-base-url", help="endpoint of the teacher (default: --base-url)")
    g.add_argument("--samples", type=int, default=1, help="attempts per task")
    g.add_argument("--max-turns", type=int, default=2, help="repair turns after a failure")
    g.add_argument("--concurrency", type=int, default=8, help="requests in flight")
    g.add_argument("--temperature", type=float, default=0.7)
    g.add_argument("--max-tokens", type=int, default=4096)
    args = p.parse_args(argv)
    args.checkout = Path(args.source.partition(":")[2]).expanduser() if ":" in args.source else None
    args.name = args.name or f"fixit-{args.source.partition(':')[0]}"
    if args.source == "model" and not args.model:
        p.error("--source model needs --model")
    if args.source == "replay" and not args.replay:
        p.error("--source replay needs --replay FILE")
    if args.models and args.checkout is None:
        p.error("--models goes with --source jaxbench:PATH")
    return args


def train_tasks(names: list[str] | None) -> list[Task]:
    """The tasks that may feed training data: every task that is not held out."""
    if not names:
        return [t for t in all_tasks() if not t.heldout_task]
    tasks = [get_task(n) for n in names]
    for task in tasks:
        if task.heldout_task:
            raise ValueError(f"task {task.name!r} is held out: it never goes into training data")
    return tasks


# Entries count their drops by a typed reason since format 2, pairs carry their failure kind
# since format 3 and what wrote their repair since format 4: an older journal is not resumed.
JOURNAL_FORMAT = 4


def settings_of(args: argparse.Namespace, tasks: list[str]) -> dict[str, Any]:
    """The arguments that decide a run's content: a resume must use the same ones."""
    keys = ["source", "context", "generation", "seed", "seeds"]
    replayed = ["teacher", "max_turns", "budget"]
    keys += {"mutation": ["operators", "max_per_task", "pool"],
             "model": ["model", "teacher", "samples", "max_turns", "temperature"],
             "replay": ["replay", *replayed]}.get(args.source, ["models", *replayed])
    settings = {k: (str(v) if isinstance(v := getattr(args, k), Path) else v) for k in keys}
    settings["tasks"] = tasks
    settings["journal_format"] = JOURNAL_FORMAT
    settings["evaluator"] = evaluator_digest()[:12]  # a resume never mixes two graders' verdicts
    return settings


def make_source(args: argparse.Namespace, tasks: list[Task], pool: list[PoolEntry], suite: Any = None):
    """The run's source of work items; `suite` is the opened checkout of a jaxbench:PATH source."""
    if args.source == "mutation":
        source = MutationSource(tasks, args.max_per_task, args.seed, variants=pool_variants(pool))
        if args.operators:
            source.operators = tuple(operator(n) for n in args.operators)
        return source
    teacher = None
    if args.teacher:
        teacher = make_chat_model(args.teacher, base_url=args.teacher_base_url or args.base_url,
                                  api_key=args.api_key)
    if args.source == "model":
        model = make_chat_model(args.model, base_url=args.base_url, api_key=args.api_key)
        return ModelSource(tasks, model, teacher, args.samples, args.max_turns, args.temperature, args.max_tokens)
    repairs = dict(teacher=teacher, max_turns=args.max_turns, max_tokens=args.max_tokens, budget=args.budget)
    if suite is None:
        names = {t.name for t in tasks}  # a held-out task's attempts (a rebench journal has them) stay out
        return ReplaySource([i for i in read_replay(args.replay) if i.task in names], get_task, **repairs)
    items = checkout_items(suite.root, args.models, set(suite.entries))
    if args.tasks:
        items = [i for i in items if i.task in args.tasks]
    return ReplaySource(items, suite.task, name="jaxbench", **repairs)


def open_checkout(args: argparse.Namespace) -> Any:
    """The checkout of a jaxbench:PATH source, with its models checked; None for other sources."""
    if args.checkout is None:
        return None
    from suites import open_suite
    from suites.attempts import models

    suite = open_suite(args.source)
    available = models(suite.root)
    unknown = sorted(set(args.models or []) - set(available))
    unknown_tasks = sorted(set(args.tasks or []) - set(suite.entries))
    if unknown or not available or unknown_tasks:
        suite.close()
        if unknown_tasks and available and not unknown:
            raise ValueError(f"not in the checkout at {suite.root}: {', '.join(unknown_tasks)}")
        raise ValueError(f"no generated kernels of {', '.join(unknown) or 'any model'} under "
                         f"{suite.root}/pallas_eval/generated (models: {', '.join(available) or 'none'})")
    return suite


def run(args: argparse.Namespace) -> dict[str, Any]:
    from rich.console import Console

    console = Console(stderr=True)
    start = time.perf_counter()
    suite = open_checkout(args)
    with suite if suite is not None else contextlib.nullcontext():
        return _run(args, console, start, suite)


def _run(args: argparse.Namespace, console: Any, start: float, suite: Any) -> dict[str, Any]:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from evaluator.grader import Evaluator

    if args.generation is None:
        from suites.jaxbench import TUNED_FOR

        args.generation = TUNED_FOR if suite is not None else DEFAULT_GENERATION
    tasks = train_tasks(args.tasks) if suite is None else []
    names = {t.name for t in tasks}
    pool = [e for e in load_pool(args.pool) if e.task in names] if args.source == "mutation" else []
    source = make_source(args, tasks, pool, suite)
    run_dir = args.runs_dir / args.name
    if args.fresh and (run_dir / "journal.jsonl").exists():
        (run_dir / "journal.jsonl").unlink()
    task_names = sorted(names) if suite is None else sorted(args.tasks or suite.entries)
    journal = Journal(run_dir / "journal.jsonl", settings_of(args, task_names))

    # 1-2) work items, minus what the journal already holds
    items = source.items()
    todo = [i for i in items if i.id not in journal.done]
    console.print(f"[bold]{args.name}[/]: {len(items)} {source.name} items over {len({i.task for i in items})} tasks; "
                  f"{len(items) - len(todo)} already in {journal.path}, {len(todo)} to do")

    # 3) grade and repair, journaling each result as soon as it is known
    known = {e["key"]: Verdict.from_dict(e["verdict"]) for e in journal.entries if e.get("kind") == "repair"}
    prompt = PromptSettings(args.context, args.generation)
    threads = args.workers if args.source == "mutation" else max(args.workers, args.concurrency)
    with Evaluator(workers=args.workers, n_seeds=args.seeds, stop_at_first_failure=True, generation=args.generation,
                   **scale_kwargs(args)) as evaluator:
        if args.source == "mutation":
            fresh, stale = fresh_verdicts(pool, evaluator.backend.name)
            known = {**fresh, **known}
            kernels = sum(len(source.kernels(t)) for t in tasks)
            console.print(f"seeds: {kernels} correct kernels ({len(fresh)} verified in {args.pool}"
                          + (f"; {stale} stale entries are graded again before use" if stale else "")
                          + ("" if pool else "; no pool, so each task's solution only") + ")")
        grader = SeededGrading(evaluator, args.seed, known, on_new_repair=lambda key, v: journal.append(
            {"kind": "repair", "id": f"repair:{key}", "key": key, "verdict": v.to_dict()}))
        columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                   TextColumn("pairs {task.fields[pairs]}, dropped {task.fields[dropped]}"))
        with Progress(*columns, console=console, transient=False, disable=not todo) as progress:
            bar = progress.add_task("grading", total=len(todo), pairs=0, dropped=0)
            counts = Counter()
            pool = ThreadPoolExecutor(max_workers=threads)
            try:
                futures = [pool.submit(source.process, item, grader, prompt) for item in todo]
                for future in as_completed(futures):
                    entry = future.result()
                    journal.append(entry)
                    counts["pairs" if entry["pair"] else "dropped"] += 1
                    progress.update(bar, advance=1, pairs=counts["pairs"], dropped=counts["dropped"])
            finally:  # on an error or Ctrl-C, stop at once: what finished is journaled
                pool.shutdown(wait=False, cancel_futures=True)

    # 4) the dataset, from everything the journal holds (this run and the ones it resumes)
    item_ids = {i.id for i in items}
    attempts = [e for e in journal.entries if e.get("kind") == "attempt" and e["id"] in item_ids]
    pairs = [e["pair"] for e in attempts if e["pair"]]
    unique = dedupe(pairs)
    rows = cap_per_edit(balance(cap_per_repair(unique, args.max_per_repair), args.balance))
    if args.source == "mutation" and not args.tasks and not args.operators:
        # the default run is calibrated to the real mix; a model's own failures are the mix they
        # are, and a run over chosen tasks or operators asked for what it has
        rows = calibrate(rows, kind_of=lambda r: r["failure_kind"],
                         spread=lambda r: (r["task"], structure(r["repair_code"])))
    real = args.source not in ("mutation", "model")
    summary = write_dataset(rows, args.out_dir / args.name, args.name, args.validation_fraction,
                            description=_description(args, suite), task_of=suite.task if suite else get_task,
                            sections=(Yield.of(attempts, rows, items, answer_limit(suite)).card_section()
                                      if real else ""),
                            license="other" if suite else "apache-2.0")
    elapsed = time.perf_counter() - start
    report = {"attempts": len(attempts), "verified_pairs": len(pairs), "unique": len(unique), "kept": len(rows),
              "failure_kinds": dict(summary.by_kind), "repair_structures": summary.diversity.repair_structures,
              "splits": summary.splits, "error_classes": dict(summary.by_error_class),
              "tasks": len(summary.by_task), "distinct_repairs": summary.diversity.distinct_repairs,
              "max_pairs_per_repair": summary.diversity.max_pairs_per_repair,
              "dropped": dict(Counter(e["drop_reason"] for e in attempts if e["dropped"])),
              "graded_this_run": len(todo), "seconds": elapsed, "path": str(summary.path)}
    _print_summary(console, report, attempts, summary)
    return report


def answer_limit(suite: Any) -> int | None:
    """The output tokens the checkout's models were allowed per answer, where it says."""
    from suites.attempts import answer_token_limit

    return answer_token_limit(suite.root) if suite is not None else None


def _description(args: argparse.Namespace, suite: Any) -> str:
    if args.source == "mutation":
        how = ("Failing kernels are verified correct kernels (task solutions and variant-pool kernels) with one "
               "bug of a kind real models make injected by an AST bug operator of the failure catalogue, or two "
               "at once, drawn towards GPT-5.3's real failure mix; the repair is the kernel the bug went into, and "
               "the explanation describes the failing kernel as the evaluator saw it fail.")
    elif args.source == "model":
        how = (f"Failing kernels were written by `{args.model}`; repairs and explanations by "
               f"`{args.teacher or args.model}` from the evaluator's feedback (up to {args.max_turns} turns).")
    else:
        from suites.attempts import models

        where = f"`{args.replay}`"
        if suite:
            where = (f"the generated kernels of {', '.join(args.models or models(suite.root))} in a JAXBench "
                     f"checkout (commit {checkout_commit(suite.root)}, `pallas_eval/generated/`)")
        teacher = f", then by `{args.teacher}` (up to {args.max_turns} turns)" if args.teacher else ""
        how = (f"Failing kernels are real attempts replayed from {where}, graded by our evaluator. Each failure "
               "without a repair of its own was repaired by the failure catalogue's repairers, applied as each "
               f"verdict named its kind and graded after each edit (at most {args.budget} gradings){teacher}; the "
               "explanation lists the edits applied, in order.")
        if suite:
            how += (" JAXBench's files carry no licence: this dataset is for local use, and is never committed "
                    "or published.")
    return f"{how} System prompt context: `{args.context}` (target {args.generation})."


def checkout_commit(root: Path) -> str:
    """The commit of the git checkout at `root`, or a note that it is none (a folder inside
    another repository is not its own checkout)."""
    import subprocess

    def git(*args: str) -> str | None:
        done = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True)
        return done.stdout.strip() if done.returncode == 0 else None

    top = git("rev-parse", "--show-toplevel")
    if top is None or Path(top).resolve() != root.resolve():
        return "unknown: not a git checkout"
    return (git("rev-parse", "HEAD") or "unknown")[:12]


def _print_summary(console: Any, report: dict[str, Any], attempts: list[dict], summary: Any) -> None:
    from rich.table import Table

    table = Table(title=f"Fixit pairs by error class ({summary.path})")
    table.add_column("error class")
    table.add_column("failing attempts", justify="right")
    table.add_column("pairs kept", justify="right")
    failing = Counter(e["status"] for e in attempts if e["status"] not in (None, "correct", "pending"))
    for status, n in failing.most_common():
        table.add_row(status, str(n), str(summary.by_error_class.get(status, 0)))
    table.add_row("[bold]total", str(sum(failing.values())), f"[bold]{report['kept']}")
    console.print(table)
    dropped = ", ".join(f"{k}: {v}" for k, v in report["dropped"].items()) or "none"
    console.print(f"{report['attempts']} attempts -> {report['verified_pairs']} verified pairs -> "
                  f"{report['unique']} unique -> {report['kept']} kept after the caps "
                  f"({report['splits']}); {report['tasks']} tasks, {len(summary.by_error_class)} error classes, "
                  f"{report['distinct_repairs']} distinct repairs (at most {report['max_pairs_per_repair']} "
                  f"pairs each). "
                  f"Dropped: {dropped}. {report['seconds']:.0f} s.")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        run(args)
    except (UnknownTaskError, EndpointError, JournalMismatch, ContaminationError, FileNotFoundError,
            ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted: finished work is in the journal; run the same command again to resume",
              file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
