"""How many of our own wrong kernels the grader calls correct: mutant survival on the variant pool.

    python benchmarks/mutant_survival.py [--sample 150] [--seed 0] [--baseline REV]

Draws a seeded sample of the runtime mutants (bug operators of the "semantic" family: wrong
values, out-of-bounds reads, races, the bugs a kernel can carry through every static stage) of
the variant pool's correct kernels, grades each on the train split, and prints how many are
graded `correct` (they survived), `unverified` (the grader could not check what they run), and
how many fail, with the survivors by operator. With `--baseline REV` the same sample is graded
first by the grader of REV (a worktree, its own process): survival before and after a grader
change, on the same mutants. Not every survivor is a grader miss: a mutation can leave a kernel
correct (a mask on a path no size takes); the list is there to be read.
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections import Counter
from pathlib import Path

import baseline  # benchmarks/baseline.py: this file's directory is on the path when it runs

ROOT = baseline.root(__file__)
sys.path.insert(0, str(ROOT))


def sample(n: int, seed: int) -> list[dict[str, str]]:
    """A seeded sample of the pool kernels' runtime mutants: {task, kernel, operator, source}."""
    from data_gen.failures.mutations import mutants
    from data_gen.failures.operators import operator
    from data_gen.pool import load_pool
    from tasks import get_task

    everyone = [{"task": e.task, "kernel": e.name, "operator": m.operator, "source": m.source}
                for e in load_pool() if e.ok
                for m in mutants(get_task(e.task), kernel=e.source) if operator(m.operator).family == "semantic"]
    return random.Random(seed).sample(everyone, min(n, len(everyone)))


def grade(items: list[dict[str, str]], seed: int) -> list[str]:
    """Each mutant's status, graded on the train split by this tree's grader."""
    from rich.progress import track

    from evaluator.grader import Evaluator, Job

    with Evaluator(workers=2, stop_at_first_failure=True) as evaluator:
        jobs = [Job(item["task"], item["source"], "train", seed) for item in items]
        verdicts = []
        for job in track(jobs, description=f"grading {len(jobs)} mutants", transient=True):
            verdicts += evaluator.grade_many([job])
    return [str(v.status) for v in verdicts]


def report(items: list[dict[str, str]], statuses: list[str], seconds: float) -> str:
    counts = Counter(statuses)
    survivors = Counter(i["operator"] for i, s in zip(items, statuses) if s == "correct")
    lines = [f"{len(items)} mutants in {seconds:.0f} s: {counts['correct']} graded correct (survived), "
             f"{counts['unverified']} unverified, {len(items) - counts['correct'] - counts['unverified']} failed"]
    lines += [f"  survived by operator: {dict(survivors.most_common())}" if survivors else "  none survived"]
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sample", type=int, default=150, help="mutants drawn")
    p.add_argument("--seed", type=int, default=0, help="sample and grading seed")
    p.add_argument("--baseline", metavar="REV", help="also grade the sample with this git revision's grader, first")
    p.add_argument("--items", type=Path, help=argparse.SUPPRESS)  # a baseline run grades this sample
    p.add_argument("--json", type=Path, help="also write the statuses here")
    args = p.parse_args()
    items = json.loads(args.items.read_text()) if args.items else sample(args.sample, args.seed)
    if args.baseline:
        start = time.perf_counter()
        before = baseline.run_at(args.baseline, __file__, ["--items", "{items}", "--seed", str(args.seed)],
                                 {"items": items})
        print(f"before ({args.baseline}):\n{report(items, before, time.perf_counter() - start)}")
    start = time.perf_counter()
    statuses = grade(items, args.seed)
    if args.json:
        args.json.write_text(json.dumps(statuses))
    if args.items:  # a baseline run: its caller reports
        return
    print(f"now:\n{report(items, statuses, time.perf_counter() - start)}")
    for item, status in zip(items, statuses):
        if status == "correct":
            print(f"  survivor: {item['task']} / {item['kernel']} / {item['operator']}")


if __name__ == "__main__":
    main()
