"""Re-grade every pair of a Fixit dataset from scratch: its failing kernel must fail and its
repair must pass every train case. `python -m data_gen.regrade DATASET [--suite jaxbench:PATH]`.

    python -m data_gen.regrade datasets/fixit-jaxbench --suite jaxbench:~/JAXBench

No verdict cache is read: each kernel is graded again, on other seeds than the collector drew.
Exit status 1 when any pair does not re-grade as (fails, passes).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from chat.prompts import code_block


def regrade(dataset: Path, suite_spec: str | None, workers: int, seed: int) -> list[tuple[str, str, str, str]]:
    """(row id, task, the failing kernel's status, the repair's status) for every row."""
    import datasets
    from evaluator.grader import Evaluator, Job
    from suites.resolver import TaskResolver

    rows = [r for split in datasets.load_dataset(str(dataset)).values() for r in split]
    with TaskResolver([suite_spec] if suite_spec else []) as resolver, \
            Evaluator(workers=workers, n_seeds=1, stop_at_first_failure=True,
                      generation=_generation(dataset)) as ev:
        jobs = [Job(resolver.task(r["task"]), code, "train", seed)
                for r in rows for code in (r["failing_code"], code_block(r["repair_code"]))]
        verdicts = ev.grade_many(jobs)
    return [(r["id"], r["task"], verdicts[2 * i].status, verdicts[2 * i + 1].status) for i, r in enumerate(rows)]


def _generation(dataset: Path) -> str:
    """The TPU generation the rows were graded for, as the card's description names it."""
    import re

    from evaluator.performance.hardware import DEFAULT_GENERATION

    card = dataset / "README.md"
    found = re.search(r"\(target (\w+)\)", card.read_text()) if card.is_file() else None
    return found.group(1) if found else DEFAULT_GENERATION


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m data_gen.regrade", description=__doc__.split("\n")[0])
    p.add_argument("dataset", type=Path)
    p.add_argument("--suite", help="jaxbench:PATH, for a dataset built from a checkout")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--seed", type=int, default=12345)
    args = p.parse_args(argv)
    if not args.dataset.is_dir():
        print(f"error: dataset folder not found: {args.dataset}", file=sys.stderr)
        return 2
    results = regrade(args.dataset, args.suite, args.workers, args.seed)
    bad = [r for r in results if r[2] == "correct" or r[3] != "correct"]
    for row_id, task, failing, repaired in results:
        mark = "ok" if (row_id, task, failing, repaired) not in bad else "BAD"
        print(f"{mark:3} {row_id} {task}: failing {failing}, repair {repaired}")
    print(f"{len(results) - len(bad)} of {len(results)} pairs re-grade as (fails, passes)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
