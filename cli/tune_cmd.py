"""`tune`: search a kernel's block sizes with the static model, then verify the best."""
from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from cli.options import UsageError, console, open_resolver, read_candidate, resolve_tasks
from evaluator.performance.hardware import DEFAULT_GENERATION, GENERATIONS, MiB


def add_parser(sub) -> None:
    """Register the subcommand on `sub` (the subparsers of python -m evaluator)."""
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


def cmd_tune(args: argparse.Namespace) -> int:
    from evaluator.candidate.extract import ExtractionError, extract_code
    from evaluator.grader import Evaluator
    from evaluator.tune import TuneError, libtpu_installed, tune

    with open_resolver(None) as ours:
        task = resolve_tasks(ours, [args.task])[0]
    try:
        source = extract_code(read_candidate(args.candidate))
    except ExtractionError as exc:
        raise UsageError(f"{args.candidate}: {exc}") from None
    from evaluator.candidate.knobs import find_knobs

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
