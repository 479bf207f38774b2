"""How well and how fast `python -m evaluator tune` recovers a solution's block sizes.

    python benchmarks/tune_recovery.py                          # matmul, gemm_bias_gelu, softmax_matmul
    python benchmarks/tune_recovery.py --task matmul --start 256 --tpu v6e

For each task it sets every BLOCK_* knob of the solution to --start (128 by default), tunes
from there with the static model, and prints the solution's own estimate, the start's, the
tuned one, their ratio (<= 1.10 is "within 10% of the solution"), the settings tried and the
wall time. Figures are printed, nothing is asserted (tests/test_tune.py checks matmul).
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("PALLAS_EVAL_ASSUME_NO_TPU", "1")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

DEFAULT_TASKS = ("matmul", "gemm_bias_gelu", "softmax_matmul")


def main(argv: list[str] | None = None) -> int:
    from rich.console import Console
    from rich.table import Table

    from evaluator.candidate.knobs import find_knobs, rewrite
    from evaluator.grader import Evaluator
    from evaluator.tune import static_trial, tune
    from tasks import get_task

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--task", action="append", default=None)
    p.add_argument("--start", type=int, default=128, help="value every BLOCK_* knob starts from")
    p.add_argument("--tpu", default="v5e")
    p.add_argument("--budget", type=float, default=110.0)
    args = p.parse_args(argv)

    table = Table(title=f"tune from every BLOCK_* = {args.start} ({args.tpu}, train bench sizes)")
    for col in ("task", "solution x ideal", "start x ideal", "tuned x ideal", "tuned / solution",
                "settings", "seconds", "chosen"):
        table.add_column(col)
    with Evaluator(backend="tpu-interpret", generation=args.tpu) as ev:
        for name in args.task or DEFAULT_TASKS:
            task = get_task(name)
            source = task.solution_source()
            knobs = [k for k in find_knobs(source) if k.name.startswith("BLOCK")]
            solution = static_trial(task, source, ev)
            start = time.perf_counter()
            result = tune(task, rewrite(source, knobs, {k.name: args.start for k in knobs}), ev,
                          budget_s=args.budget)
            seconds = time.perf_counter() - start
            table.add_row(name, f"{solution.slowdown:.3f}", f"{result.baseline.slowdown:.3f}",
                          f"{result.best.slowdown:.3f}", f"{result.best.slowdown / solution.slowdown:.3f}",
                          str(len(result.trials)), f"{seconds:.0f}",
                          ", ".join(f"{k}={v}" for k, v in result.best.setting.items()))
    Console(width=200).print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
