"""Do the cheap seeds change any verdict? Every corpus graded twice, with every check on every
seed and with the seeds after the first run without the race detector.

    python benchmarks/seed_checks_agreement.py [--corpus NAME ...] [--pool 40] [--mutants 60] [--seed 0]

The grader runs each case's first seed with every check TPU interpret mode has (the race
detector, out-of-bounds reads raised, uninitialised memory as NaN) and, where that pays, the
other seeds without the race detector (evaluator/execution/handlers.py, run). This grades each corpus
with `seed_checks="full"` (every seed, every check) and with `seed_checks="cheap"` (the other
seeds always without the detector: the most the default "auto" can ever differ), on the same
seeds, and prints per corpus how many verdicts agree, the disagreements, and the time each took.

Corpora: solutions (the tasks' own), honest (tests/honest/), thirdparty (jax's own kernels,
tests/thirdparty.py), redteam (tests/redteam/), pool (a seeded sample of the variant pool's
other correct kernels) and mutants (a seeded sample of the pool kernels' mutants,
data_gen/failures/mutations.py).
"""
from __future__ import annotations

import argparse
import random
import re
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

CORPORA = ("solutions", "honest", "thirdparty", "redteam", "pool", "mutants")


def corpus(name: str, n_pool: int, n_mutants: int, seed: int) -> list[tuple[str, Any, str]]:
    """(label, task or task name, source) of one corpus, graded on the train split."""
    if name in ("solutions", "honest", "thirdparty"):
        from benchmarks.seed_stability import honest_kernels

        return [(label, task, source) for label, task, split, source in honest_kernels([name], None)
                if split in ("train", "all")]
    if name == "redteam":
        out = []
        for path in sorted((ROOT / "tests" / "redteam").glob("*.py")):
            match = re.search(r"task:\s*(\w+)\s+expect:", path.read_text())
            out.append((f"redteam/{path.stem}", match.group(1), path.read_text()))
        return out
    from data_gen.pool import load_pool

    kernels = [e for e in load_pool() if e.ok and e.name != "solution"]
    pick = random.Random(seed)
    if name == "pool":
        return [(f"pool/{e.task}/{e.name}", e.task, e.source)
                for e in pick.sample(kernels, min(n_pool, len(kernels)))]
    from data_gen.failures.mutations import mutants
    from tasks import get_task

    everyone = [(e, m) for e in kernels for m in mutants(get_task(e.task), kernel=e.source)]
    return [(f"mutant/{e.task}/{e.name}/{m.operator}", e.task, m.source)
            for e, m in pick.sample(everyone, min(n_mutants, len(everyone)))]


def grade_all(items: list[tuple[str, Any, str]], seed_checks: str, seed: int) -> tuple[list[Any], float]:
    from rich.progress import track

    from evaluator.grader import Evaluator, Job

    with Evaluator(workers=1, seed_checks=seed_checks) as evaluator:
        evaluator.warm_up()
        start = time.perf_counter()
        verdicts = [evaluator.grade_many([Job(task, source, "train", seed)])[0]
                    for _, task, source in track(items, description=f"{seed_checks:5s}", transient=True)]
        return verdicts, time.perf_counter() - start


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--corpus", dest="corpora", action="append", choices=CORPORA)
    p.add_argument("--pool", type=int, default=40, help="pool kernels sampled")
    p.add_argument("--mutants", type=int, default=60, help="pool mutants sampled")
    p.add_argument("--seed", type=int, default=0, help="grading seed and mutant sample")
    args = p.parse_args()
    rows = ["| corpus | kernels | same verdict | graded with the detector off on some seed | time, full checks | time, cheap seeds | ratio |",
            "|---|---:|---:|---:|---:|---:|---:|"]
    differences = []
    for name in args.corpora or CORPORA:
        items = corpus(name, args.pool, args.mutants, args.seed)
        full, full_s = grade_all(items, "full", args.seed)
        cheap, cheap_s = grade_all(items, "cheap", args.seed)
        same = 0
        for (label, *_), a, b in zip(items, full, cheap):
            if a.status == b.status:
                same += 1
            else:
                differences.append(f"{name}: {label}: full {a.status}, cheap {b.status}: {b.message[:160]}")
        used = sum(any("no race detection" in c.seed_checks for c in v.cases) for v in cheap)
        rows.append(f"| {name} | {len(items)} | {same} | {used} | {full_s:.0f} s | {cheap_s:.0f} s | "
                    f"{cheap_s / full_s:.2f} |")
        print(rows[-1], flush=True)
    print("\n" + "\n".join(rows))
    print("\n" + ("\n".join(differences) if differences else "every verdict agrees"))


if __name__ == "__main__":
    main()
