"""Grading at scale on this machine: local workers, Ray actors, and the verdict cache.

    python benchmarks/scale.py [--tasks 6] [--repeat 2]

One batch of correct kernels (the first --tasks solutions, each graded --repeat times with
fresh seeds) is graded five ways, and candidates per minute are printed for each:
  local 1 / local 2   one Evaluator with 1 or 2 sandboxed worker processes,
  ray 1 / ray 2       Evaluator(executor="ray") with 1 or 2 actors on a local Ray cluster
                      (ray.init(num_cpus=2)), each actor owning one sandboxed worker,
  cache hits          the batch again through a verdict cache that already holds it.
It also prints the ratios the design targets: Ray with 2 actors within 1.25x of local grading
with 2 workers, and a cache hit at least 100x cheaper than grading a correct kernel. Workers
and actors are started and warmed before timing. Timings on shared cores are noisy: compare
figures from one run.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("PALLAS_EVAL_ASSUME_NO_TPU", "1")

from evaluator.grader import Evaluator, Job  # noqa: E402
from tasks import all_tasks  # noqa: E402


def timed(evaluator: Evaluator, jobs: list[Job]) -> float:
    """Seconds to grade the batch, after one warm-up grading per worker."""
    evaluator.grade_many(jobs[: evaluator.workers])
    start = time.perf_counter()
    verdicts = evaluator.grade_many(jobs)
    elapsed = time.perf_counter() - start
    bad = [v for v in verdicts if not v.ok]
    if bad:
        raise SystemExit(f"a solution failed: {bad[0].task}: {bad[0].message[:200]}")
    return elapsed


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tasks", type=int, default=6, help="solutions in the batch")
    p.add_argument("--repeat", type=int, default=2, help="times each solution is graded")
    args = p.parse_args()
    import ray

    tasks = [t for t in all_tasks() if not t.heldout_task][: args.tasks]
    jobs = [Job(t.name, t.solution_source()) for t in tasks] * args.repeat
    n = len(jobs)
    print(f"batch: {n} gradings of {len(tasks)} correct kernels ({', '.join(t.name for t in tasks)}); "
          f"{os.cpu_count()} cores")
    seconds: dict[str, float] = {}
    for workers in (1, 2):
        with Evaluator(workers=workers) as ev:
            ev.warm_up()
            seconds[f"local {workers}"] = timed(ev, jobs)
        print(f"  local {workers}: {60 * n / seconds[f'local {workers}']:.1f}/min", flush=True)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        for actors in (1, 2):
            with Evaluator(executor="ray", workers=actors) as ev:
                seconds[f"ray {actors}"] = timed(ev, jobs)
            print(f"  ray {actors}: {60 * n / seconds[f'ray {actors}']:.1f}/min", flush=True)
    finally:
        ray.shutdown()
    with tempfile.TemporaryDirectory() as folder, Evaluator(workers=2, cache=folder) as ev:
        ev.grade_many(jobs[: len(tasks)])            # fill the cache (fresh seeds: one key per kernel)
        start = time.perf_counter()
        hits = ev.grade_many(jobs)
        seconds["cache hits"] = time.perf_counter() - start
        assert all(v.cached for v in hits), "the second pass should be all hits"
    print(f"  cache hits: {60 * n / seconds['cache hits']:.0f}/min")

    print("\n| how | candidates/min | s per candidate | vs local 2 |")
    print("|---|---:|---:|---:|")
    for name, s in seconds.items():
        print(f"| {name} | {60 * n / s:.1f} | {s / n:.4f} | {seconds['local 2'] / s:.2f}x |")
    ray_ratio = seconds["ray 2"] / seconds["local 2"]
    hit_ratio = seconds["local 1"] / seconds["cache hits"]
    print(f"\nray 2 actors take {ray_ratio:.2f}x the time of local 2 workers (target <= 1.25x): "
          f"{'ok' if ray_ratio <= 1.25 else 'MISSED'}")
    print(f"a cache hit is {hit_ratio:.0f}x cheaper than grading a correct kernel with one worker "
          f"(target >= 100x): {'ok' if hit_ratio >= 100 else 'MISSED'}")


if __name__ == "__main__":
    main()
