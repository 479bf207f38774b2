"""Evaluator throughput on this machine: warm workers vs a fresh process per candidate.

    python benchmarks/throughput.py [--repeat 3] [--fresh-limit 12] [--max-solutions 8]

Two batches: small candidates that fail before running (start-up dominates their cost) and
the task solutions on their train cases. For each it prints candidates per minute for
  warm       one Evaluator, one reused worker process (the normal path),
  fresh      `python -m evaluator run ...` in a new process per candidate,
  in-process the same stages with the worker's handlers called in this process: the
             candidates' own trace + lower + compile + run time, no sandbox,
and the ratios the evaluator's design targets: warm/fresh >= 3x on the small batch, and
warm wall time <= 1.3x in-process on both. Timings on shared cores are noisy: compare
figures from one run.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("PALLAS_EVAL_ASSUME_NO_TPU", "1")

from evaluator.execution import handlers, jax_hooks  # noqa: E402
from evaluator.execution.protocol import Done, Reset  # noqa: E402
from evaluator.grader import Evaluator, Job  # noqa: E402
from tasks import all_tasks  # noqa: E402

SMALL = [  # (candidate file under tests/candidates, task): each fails before the run stage
    ("no_kernel_plain_jnp", "softmax"),
    ("work_outside_row_max", "softmax"),
    ("work_outside_dot", "matmul"),
    ("work_outside_pure_callback", "softmax"),
    ("missing_feature_no_scalar_prefetch", "grouped_matmul"),
    ("lowering_error_block_7x100", "matmul"),
    ("compile_error_vmem_overflow", "matmul"),
    ("import_error_raises", "softmax"),
]


class InProcessWorker:
    """The worker's request handlers, called directly: what grading costs without a sandbox."""

    alive = True

    def __init__(self) -> None:
        self.state = handlers.WorkerState(interpret=True)

    def call(self, request, arrays=(), timeout_s=None, what=""):
        if isinstance(request, Reset):  # sandbox upkeep, not the candidate's own work
            return Done(), []
        return handlers.handle(self.state, request, list(arrays))

    def kill(self) -> None:
        pass


class InProcessPool:
    def __init__(self) -> None:
        self.worker = InProcessWorker()

    @contextlib.contextmanager
    def lease(self):
        yield self.worker

    def warm_up(self) -> None:
        pass

    def close(self) -> None:
        pass


def batches(repeat: int, max_solutions: int) -> dict[str, list[Job]]:
    small = [Job(task, (ROOT / "tests" / "candidates" / f"{name}.py").read_text(), "train", 0)
             for name, task in SMALL] * repeat
    solutions = [Job(t.name, t.solution_source(), "train", 0) for t in all_tasks()][:max_solutions]
    return {"small": small, "solutions": solutions}


def run_warm(jobs: list[Job]) -> tuple[float, list[str]]:
    with Evaluator(backend="tpu-interpret", workers=1) as ev:
        ev.warm_up()  # a long-running service starts its workers once
        start = time.perf_counter()
        statuses = [ev.grade(j.task, j.answer, j.split, j.seed).status for j in jobs]
        return time.perf_counter() - start, statuses


def run_in_process(jobs: list[Job]) -> tuple[float, list[str]]:
    jax_hooks.install()
    ev = Evaluator(backend="tpu-interpret", pool=InProcessPool())
    ev.grade(jobs[0].task, jobs[0].answer, jobs[0].split, jobs[0].seed)  # import/compile warm-up
    start = time.perf_counter()
    statuses = [ev.grade(j.task, j.answer, j.split, j.seed).status for j in jobs]
    return time.perf_counter() - start, statuses


def run_fresh(jobs: list[Job]) -> tuple[float, list[str]]:
    statuses = []
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        for i, job in enumerate(jobs):
            path = Path(tmp) / f"candidate_{i}.py"
            path.write_text(job.answer)
            out = subprocess.run([sys.executable, "-m", "evaluator", "run", "--task", job.task,
                                  "--candidate", str(path), "--split", job.split, "--seed",
                                  str(job.seed), "--json"], cwd=ROOT, capture_output=True, text=True)
            statuses.append(_status(out.stdout))
        return time.perf_counter() - start, statuses


def _status(stdout: str) -> str:
    import json

    try:
        return json.loads(stdout)["status"]
    except (ValueError, KeyError):
        return "error"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--repeat", type=int, default=3, help="copies of the small batch")
    p.add_argument("--fresh-limit", type=int, default=12,
                   help="grade at most this many candidates of a batch fresh (slow); rate is per candidate")
    p.add_argument("--max-solutions", type=int, default=8,
                   help="grade the first N task solutions (the whole suite takes long)")
    args = p.parse_args()
    rows = []
    for name, jobs in batches(args.repeat, args.max_solutions).items():
        warm_s, warm_status = run_warm(jobs)
        own_s, own_status = run_in_process(jobs)
        fresh_jobs = jobs[: args.fresh_limit]
        fresh_s, fresh_status = run_fresh(fresh_jobs)
        assert warm_status == own_status, (warm_status, own_status)
        assert fresh_status == warm_status[: len(fresh_jobs)], (fresh_status, warm_status)
        rate = lambda n, s: 60.0 * n / s
        rows.append((name, len(jobs), rate(len(jobs), warm_s), rate(len(fresh_jobs), fresh_s),
                     rate(len(jobs), own_s), warm_s / own_s,
                     statistics.mode(warm_status)))
    print(f"\nbackend tpu-interpret, {os.cpu_count()} cores, one worker; candidates per minute")
    print(f"{'batch':<10} {'n':>3} {'warm':>8} {'fresh':>8} {'in-proc':>8} {'warm/fresh':>10} "
          f"{'warm wall/in-proc':>17}")
    for name, n, warm, fresh, own, overhead, _ in rows:
        print(f"{name:<10} {n:>3} {warm:>8.1f} {fresh:>8.1f} {own:>8.1f} {warm / fresh:>9.1f}x "
              f"{overhead:>16.2f}x")
    print("targets: warm/fresh >= 3x on the small batch; warm wall / in-process <= 1.3x on both")


if __name__ == "__main__":
    main()
