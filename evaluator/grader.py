"""The evaluator's front door: grade one candidate or many, on a pool of warm workers."""
from __future__ import annotations

import hashlib
import os
import platform
import secrets
import socket
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

from evaluator.cache import VerdictCache, cache_key
from evaluator.digest import task_digest
from evaluator.execution.backends import default_backend, get_backend
from evaluator.execution.protocol import SEED_CHECKS, Reset
from evaluator.execution.remote import ActorsLost, RayExecutor
from evaluator.execution.sandbox import Limits, WorkerError, WorkerPool
from evaluator.performance import calibration
from evaluator.performance.hardware import DEFAULT_GENERATION, GENERATIONS
from evaluator.record import StageTiming, Status, Verdict
from evaluator.stages import (SOURCE_STAGES, STAGE_NAMES, STAGES, Failure, GradingContext, Stage, correct_message,
                              predict_failed)
from evaluator.truth.reference import ReferenceCache
from evaluator.truth.xla_reference import ReferenceCosts
from tasks import get_task
from tasks.spec import Task

EVALUATOR_VERSION = "0.1.0"
# Verdicts after which the worker is replaced rather than reset: the candidate's fault may
# have left the worker's JAX runtime in a bad state (seen: every run fails after an OOM).
RECYCLE_AFTER = frozenset({"runtime_error", "timeout"})


@dataclass(frozen=True)
class Job:
    """One thing to grade: a task (or its name) and a model answer (or bare source)."""

    task: str | Task
    answer: str
    split: str = "train"
    seed: int | None = None
    through: str | None = None  # stop after this stage (Evaluator.grade)


class Evaluator:
    """Grades candidates. Reuse one instance: its workers stay warm between candidates."""

    def __init__(self, backend: str | None = None, workers: int = 1, limits: Limits = Limits(),
                 generation: str = DEFAULT_GENERATION, n_seeds: int = 2,
                 pool: WorkerPool | None = None, stop_at_first_failure: bool = False,
                 tpu_numerics: bool = True, executor: str = "local", address: str | None = None,
                 cache: str | Path | VerdictCache | None = None, seed_checks: str = "auto",
                 predict_failed: bool = False):
        """`executor="ray"`: grade on `workers` Ray actors of the cluster at `address` ("auto",
        "ray://host:10001", or "local" for a private one) instead of local worker processes.
        `cache`: a folder (or VerdictCache) of verdicts already reached, looked up first.
        `seed_checks`: where interpret mode's race detector runs (protocol.SEED_CHECKS,
        evaluator/execution/handlers.py, run): "auto" (default), "full" or "cheap".
        `predict_failed`: a verdict that failed a stage after tracing still gets its
        `predicted_speedup` (the `estimate` command's listing of every kernel that traces)."""
        if executor not in ("local", "ray"):
            raise ValueError(f"unknown executor {executor!r}; choose local or ray")
        if seed_checks not in SEED_CHECKS:
            raise ValueError(f"unknown seed_checks {seed_checks!r}; choose one of {', '.join(SEED_CHECKS)}")
        self.seed_checks = seed_checks
        self.backend = get_backend(backend or default_backend())
        if generation not in GENERATIONS:
            raise ValueError(f"unknown TPU generation {generation!r}; choose one of {', '.join(GENERATIONS)}")
        self.generation = GENERATIONS[generation]
        self.n_seeds = n_seeds
        # Confirming that a kernel fails needs one failing case; data_gen sets this to save time.
        self.stop_at_first_failure = stop_at_first_failure
        # Interpret mode computes a kernel's f32 dots as a TPU does (one bf16 pass) unless
        # turned off; on a real TPU the chip decides (evaluator/execution/program.py, tpu_dot_numerics).
        self.tpu_numerics = tpu_numerics
        self.limits = limits
        # One process holds a TPU chip (a second one's libtpu stops at the chip's lock file):
        # on the chip, one worker whatever was asked.
        self.workers = 1 if self.backend.platform == "tpu" and executor == "local" else workers
        self.cache = VerdictCache(cache) if isinstance(cache, (str, Path)) else cache
        self.remote = None
        if executor == "ray":
            options = {"backend": self.backend.name, "workers": 1, "limits": limits, "generation": generation,
                       "n_seeds": n_seeds, "stop_at_first_failure": stop_at_first_failure,
                       "tpu_numerics": tpu_numerics, "seed_checks": seed_checks, "predict_failed": predict_failed}
            self.remote = RayExecutor(address, workers, GradingActor, options)
        # `pool` lets a benchmark swap the sandbox for an in-process stand-in.
        self.pool = pool or WorkerPool(self.backend, size=0 if self.remote else self.workers, limits=limits)
        self.references = ReferenceCache()
        self.reference_costs = ReferenceCosts(task_digest, limits, workers=workers)
        self.calibration = calibration.load(compiled=self.backend.topology_compile, generation=self.generation.name)
        self.predict_failed = predict_failed

    @property
    def numerics(self) -> str:
        """How kernel dots were computed, so a CPU verdict can be set beside a TPU one."""
        if not self.backend.interpret:
            return "tpu-hardware"
        if self.tpu_numerics:
            return "tpu-default-precision (f32 dot operands rounded to bf16, f32 accumulation)"
        return "exact-f32 (CPU)"

    def grade(self, task: Task | str, answer: str, split: str = "train",
              seed: int | None = None, through: str | None = None) -> Verdict:
        """`through`: stop after this stage (e.g. "estimate": every static stage, nothing run);
        a grading stopped early with no failure keeps status "pending"."""
        task = get_task(task) if isinstance(task, str) else task
        task.select(split)  # validates the split name
        stages = _stages_through(through)
        key = None
        if self.cache is not None:
            key = cache_key(task, answer, self.cache_settings(split, seed, through))
            if (hit := self.cache.get(key)) is not None:
                return hit
        if self.remote is not None:
            try:
                verdict = Verdict.from_dict(self.remote.grade(task, answer, split, seed, through))
            except ActorsLost as lost:
                verdict = self._lost_verdict(task, answer, split, lost.deaths)
        else:
            verdict = self._grade_here(task, answer, split, seed, stages, through)
        if key is not None:
            self.cache.put(key, verdict)
        return verdict

    def _lost_verdict(self, task: Task, answer: str, split: str, deaths: list[str]) -> Verdict:
        """A candidate whose gradings killed every Ray actor they ran on."""
        message = (f"runtime_error: grading this kernel killed the evaluator's process {len(deaths)} times "
                   f"({', '.join(deaths)}); it was not graded to the end. A kernel that exhausts the host's "
                   "memory or crashes the process that runs it does this.")
        verdict = Verdict(task=task.name, task_version=task.version, status=Status.RUNTIME_ERROR, message=message,
                          backend=self.backend.name, split=split, stage="run", error_type="ActorDied",
                          error=message, versions=_versions(),
                          candidate_sha256=hashlib.sha256(answer.encode()).hexdigest())
        verdict.details["actor_deaths"] = len(deaths)
        return verdict

    def cache_settings(self, split: str, seed: int | None, through: str | None) -> dict[str, object]:
        """Everything besides code, task and evaluator that decides a verdict (evaluator/cache.py)."""
        settings: dict[str, object] = {
            "split": split, "backend": self.backend.name, "generation": self.generation.name,
            "numerics": self.numerics, "n_seeds": self.n_seeds, "stop_at_first_failure": self.stop_at_first_failure,
            "through": through, "seed": "fresh" if seed is None else seed,
            "step_timeout_s": self.limits.step_timeout_s, "run_ceiling_s": self.limits.run_ceiling_s,
            "seed_checks": self.seed_checks, "calibration": self.calibration.to_dict(),
            "predict_failed": self.predict_failed}
        if self.backend.times_kernels:   # timings hold for the device they were measured on
            settings["device"] = os.environ.get("TPU_ACCELERATOR_TYPE") or f"host {socket.gethostname()}"
        return settings

    def _grade_here(self, task: Task, answer: str, split: str, seed: int | None,
                    stages: tuple[Stage, ...], through: str | None) -> Verdict:
        start = time.perf_counter()
        verdict = Verdict(task=task.name, task_version=task.version, status=Status.PENDING, message="",
                          backend=self.backend.name, split=split, stage="",
                          versions=_versions(), candidate_sha256=hashlib.sha256(answer.encode()).hexdigest())
        ctx = GradingContext(task=task, answer=answer, split=split, backend=self.backend,
                             generation=self.generation,
                             base_seed=secrets.randbits(31) if seed is None else seed,
                             n_seeds=self.n_seeds, references=self.references, verdict=verdict,
                             stop_at_first_failure=self.stop_at_first_failure,
                             tpu_numerics=self.tpu_numerics, seed_checks=self.seed_checks,
                             limits=self.limits, reference_costs=self.reference_costs,
                             calibration=self.calibration)
        verdict.details["base_seed"] = ctx.base_seed
        verdict.details["tpu_generation"] = self.generation.name
        verdict.details["numerics"] = self.numerics
        failure = self._run_stages(ctx, stages)
        if failure is None and through is not None:
            verdict.stage, verdict.message = through, f"passed every stage through {through!r}"
        elif failure is None:
            verdict.status, verdict.stage, verdict.message = Status.CORRECT, "done", correct_message(ctx)
        else:
            verdict.status, verdict.message = failure.status, f"{failure.status}: {failure.message}"
            verdict.error_type, verdict.error = failure.error_type, failure.error
            verdict.failing_case, verdict.vmem = failure.case, failure.vmem
            verdict.details.update(failure.details)
        verdict.wall_s = time.perf_counter() - start
        return verdict

    def _run_stages(self, ctx: GradingContext, stages: tuple[Stage, ...] = STAGES) -> Failure | None:
        lease = None
        ahead: list[Future] = []
        failure: Failure | None = None
        finished = False  # False when interrupted (Ctrl-C) or our own code raised mid-stage
        try:
            for stage in stages:
                if stage.name not in SOURCE_STAGES and ctx.worker is None:
                    lease = self.pool.lease()
                    ctx.worker = lease.__enter__()
                    if any(s.name == "run" for s in stages):  # made while the worker traces
                        ahead = self.references.ahead(ctx.task, ctx.traced_cases, ctx.run_plan)
                t0 = time.perf_counter()
                try:
                    failure = stage.run(ctx)
                except WorkerError as exc:
                    status = Status.TIMEOUT if exc.kind == "timeout" else Status.RUNTIME_ERROR
                    failure = Failure(status, f"{exc}.", "WorkerTimeout" if exc.kind == "timeout"
                                      else "WorkerCrash", str(exc))
                    for case in ctx.verdict.cases:
                        if case.status == Status.PENDING:
                            case.status, case.error = status, str(exc)
                ctx.verdict.stage_timings.append(StageTiming(stage.name, time.perf_counter() - t0))
                if failure is not None:
                    ctx.verdict.stage = stage.name
                    if self.predict_failed and ctx.verdict.predicted_speedup is None:
                        predict_failed(ctx)  # while the worker still holds the traced programs
                    finished = True
                    return failure
            finished = True
            return None
        finally:
            for job in ahead:
                job.cancel()  # a grading that ended early leaves the rest unmade
            if lease is not None:
                # Any case that crashed or hung counts, not only the status the verdict reports:
                # a runtime error in a later case left an earlier candidate's exception to surface
                # in the next candidate graded on the same worker. A grading cut short may have
                # left the worker deep in a kernel: it is killed, not asked to reset.
                faulted = {failure.status} if failure is not None else set()
                faulted |= {case.status for case in ctx.verdict.cases}
                if faulted & RECYCLE_AFTER or not finished:
                    ctx.worker.kill()  # a fault can leave JAX's runtime unusable (e.g. after OOM)
                elif ctx.worker.alive:
                    try:
                        ctx.worker.call(Reset(), timeout_s=30, what="resetting")
                    except WorkerError:
                        pass  # the worker is gone; the pool starts a new one on next use
                lease.__exit__(None, None, None)

    def grade_many(self, jobs: Iterable[Job], on_done: Callable[[Verdict], None] | None = None
                   ) -> list[Verdict]:
        """Grade concurrently, one thread per worker; results in the order of `jobs`."""
        jobs = list(jobs)

        def one(job: Job) -> Verdict:
            verdict = self.grade(job.task, job.answer, job.split, job.seed, job.through)
            if on_done is not None:
                on_done(verdict)
            return verdict

        with ThreadPoolExecutor(max_workers=self.workers) as ex:
            return list(ex.map(one, jobs))

    def warm_up(self) -> None:
        if self.remote is None:
            self.pool.warm_up()

    def close(self) -> None:
        if self.remote is not None:
            self.remote.close()
        self.pool.close()
        self.reference_costs.close()

    def __enter__(self) -> "Evaluator":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class GradingActor:
    """What each Ray actor runs (evaluator/execution/remote.py): a local evaluator with warm sandboxed
    workers, answering with verdicts as plain data."""

    def __init__(self, options: dict[str, object]):
        self.evaluator = Evaluator(**options)
        self.evaluator.warm_up()

    def grade(self, task: Task, answer: str, split: str, seed: int | None, through: str | None) -> dict:
        """`task` arrives as itself (pickled by Ray), an imported one rebuilt here from its suite."""
        return self.evaluator.grade(task, answer, split, seed, through).to_dict()


def _stages_through(last: str | None) -> tuple[Stage, ...]:
    if last is None:
        return STAGES
    if last not in STAGE_NAMES:
        raise ValueError(f"unknown stage {last!r}; the stages are {', '.join(STAGE_NAMES)}")
    return STAGES[:STAGE_NAMES.index(last) + 1]


def _versions() -> dict[str, str]:
    import jax
    import jaxlib

    return {"evaluator": EVALUATOR_VERSION, "jax": jax.__version__, "jaxlib": jaxlib.__version__,
            "python": platform.python_version()}
