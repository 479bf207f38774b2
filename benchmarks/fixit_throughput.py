"""Verified Fixit pairs per hour with the mutation source, on this machine.

    python benchmarks/fixit_throughput.py                  # 10 tasks across levels, 2 workers
    python benchmarks/fixit_throughput.py --tasks matmul softmax --max-per-task 20 --workers 1

Runs `data_gen.collect` from scratch (a fresh journal in a temporary folder), then prints the
attempts graded, the verified pairs, the wall time and pairs per hour. The figure counts every
pair the evaluator verified (before balancing caps, which are a dataset choice, not a cost).
"""
from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

DEFAULT_TASKS = ["softmax", "rms_norm", "matmul", "conv1d", "topk", "gemm_softmax", "rotary_embedding",
                 "swiglu_mlp", "attention_fwd", "paged_attention"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", nargs="+", default=DEFAULT_TASKS)
    parser.add_argument("--max-per-task", type=int, default=12)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()

    from data_gen.collect import parse_args, run

    with tempfile.TemporaryDirectory() as tmp:
        argv = [a for t in args.tasks for a in ("--task", t)]
        argv += ["--max-per-task", str(args.max_per_task), "--workers", str(args.workers), "--name", "bench",
                 "--out-dir", str(Path(tmp) / "datasets"), "--runs-dir", str(Path(tmp) / "runs")]
        start = time.perf_counter()
        report = run(parse_args(argv))
        wall = time.perf_counter() - start
    pairs = report["verified_pairs"]
    print(f"tasks: {len(args.tasks)}, workers: {args.workers}")
    print(f"attempts graded: {report['attempts']} ({report['attempts'] / wall * 60:.1f}/min)")
    print(f"verified pairs: {pairs} ({pairs / max(1, report['attempts']):.0%} of attempts)")
    print(f"wall time: {wall:.0f} s (start-up and dataset writing included)")
    print(f"verified pairs per hour: {pairs / wall * 3600:.0f}")


if __name__ == "__main__":
    main()
