"""Graded rewards per minute: how many CPU cores RL needs beside a GPU so grading keeps up.

    python benchmarks/reward_throughput.py [--answers 24] [--workers 1 2] [--seed 0]

The answers are what an RL batch holds: for tasks drawn from ours, the expert solution (correct:
every stage runs, the expensive path), failing kernels from the Fixit dataset (failing at
whichever stage they fail), and answers with no code (the first stage refuses them). Each
answer goes through training/reward.py's reward, as training.rl grades it. For each worker
count: a cold pass (an empty verdict cache, warm workers) and a cached pass (the same answers
again, as GRPO's repeated samples and resumed runs meet them). Timings on shared cores are
noisy: compare figures from one run.
"""
from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def answer_mix(n: int, seed: int) -> list[tuple[str, str, str]]:
    """(task, kind, answer): a third correct solutions, a third failing kernels, a third no code."""
    import datasets
    import tasks

    rng = random.Random(seed)
    rows = list(datasets.load_dataset(str(ROOT / "datasets" / "fixit-mutation"), split="train"))
    rng.shuffle(rows)
    out = []
    for i in range(n):
        row = rows[i % len(rows)]
        kind = ("correct", "failing", "no code")[i % 3]
        if kind == "correct":
            answer = f"```python\n{tasks.get_task(row['task']).solution_source()}\n```"
        elif kind == "failing":
            answer = f"```python\n{row['failing_code']}\n```"
        else:
            answer = "I cannot write this kernel."
        out.append((row["task"], kind, answer))
    return out


def measure(answers: list[tuple[str, str, str]], workers: int) -> dict[str, float]:
    """Seconds for the cold and the cached pass, and the rewards' mean."""
    from evaluator.grader import Evaluator, Job
    from training.reward import RewardSpec

    spec = RewardSpec()
    with tempfile.TemporaryDirectory() as cache, Evaluator(workers=workers, cache=cache) as ev:
        ev.grade_many([Job(answers[0][0], "no code warms nothing", "train")] * workers)  # start the workers
        figures = {}
        for label in ("cold", "cached"):
            start = time.perf_counter()
            verdicts = ev.grade_many(Job(task, answer, "train") for task, _, answer in answers)
            figures[label] = time.perf_counter() - start
        figures["mean_reward"] = statistics.mean(spec.reward(v) for v in verdicts)
        figures["correct"] = sum(v.ok for v in verdicts)
    return figures


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--answers", type=int, default=24)
    p.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    answers = answer_mix(args.answers, args.seed)
    print(f"{len(answers)} answers: " + ", ".join(f"{k} {sum(a[1] == k for a in answers)}"
                                                 for k in ("correct", "failing", "no code")))
    print("| workers | cold s | cold rewards/min | cached s | cached rewards/min | correct | mean reward |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for workers in args.workers:
        f = measure(answers, workers)
        print(f"| {workers} | {f['cold']:.1f} | {60 * len(answers) / f['cold']:.1f} | {f['cached']:.2f} | "
              f"{60 * len(answers) / f['cached']:.0f} | {f['correct']} | {f['mean_reward']:.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
