"""XLA's cost of each task's reference at each case for a generation, compiled once per content.

Looked up in the disk cache (evaluator/performance/xla_cost.py, XlaCostCache) first, then in
the costs shipped with the project (SHIPPED_XLA_COSTS: our tasks' references at their bench
cases, written by `python -m evaluator estimate --ship-xla-costs`), else compiled by libtpu in
workers of their own: no candidate's code is loaded there, so a libtpu crash or a slow compile
costs the candidate's grading nothing but the prediction's XLA side. A compile that XLA rejects
is recorded on disk as such: the next grading of the same reference does not wait for it again.
A worker that crashed or ran over REFERENCE_COMPILE_S is remembered for this run only: those
depend on this machine's limits and load, and a later run may get further.
"""
from __future__ import annotations

import dataclasses
import importlib.metadata
import importlib.util
import threading
from pathlib import Path
from typing import Callable

import tasks
from evaluator.execution.backends import BACKENDS
from evaluator.execution.protocol import CaseSpec, Costed, ReferenceCost
from evaluator.execution.sandbox import Limits, WorkerError, WorkerPool
from evaluator.performance.hardware import TpuGeneration
from evaluator.performance.xla_cost import XlaCostCache, XlaProgramCost
from tasks.spec import Case, Task

NO_LIBTPU = "libtpu is not installed (pip install -e '.[tpu-compile]')"
# The longest a reference's compile may take (JAXBench's took a median 4.6 s, at most 122 s, and
# a 3-D transposed convolution over 5 minutes): longer, the prediction prices it by our model.
REFERENCE_COMPILE_S = 150.0
# A reference's compile worker loads no candidate, so it may map more than a grading worker's
# 8 GiB: libtpu's compile of a large 3-D transposed convolution (JAXBench level 1's 58) peaked
# at 6.9 GiB resident and died on the 8 GiB address-space cap ("mmap error: 12"), as did level
# 1's 62 and level 2's 13; all three compile under 16 GiB (level 2's 38 and 44 crash libtpu
# whatever the cap).
REFERENCE_COMPILE_GB = 16.0
SHIPPED_XLA_COSTS = Path(tasks.__file__).parent / "xla_costs.json"


def libtpu_version() -> str | None:
    if importlib.util.find_spec("libtpu") is None:
        return None
    try:
        return importlib.metadata.version("libtpu")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


class ReferenceCosts:
    """`cost(task, case, spec, gen)`: XLA's figures, or why there are none (a string)."""

    def __init__(self, digest: Callable[[Task], str], limits: Limits = Limits(), cache: XlaCostCache | None = None,
                 workers: int = 1, compile_s: float = REFERENCE_COMPILE_S, retry_errors: bool = False):
        """`digest`: a content hash of a task's reference code (evaluator/digest.py, task_digest);
        `workers`: compiles at once (one per grading thread: a slow compile holds up only its own);
        `compile_s`, `retry_errors`: the compile limit, and whether a failure the cache recorded is
        compiled again (shipping the costs waits longer than a grading, and once)."""
        self.digest = digest
        self.limits = dataclasses.replace(limits, step_timeout_s=compile_s,
                                          memory_gb=max(limits.memory_gb, REFERENCE_COMPILE_GB))
        self.retry_errors = retry_errors
        self.cache = cache or XlaCostCache(shipped=SHIPPED_XLA_COSTS)
        self.libtpu = libtpu_version()
        self._pool: WorkerPool | None = None
        self._workers = max(1, workers)
        self._lock = threading.Lock()
        self._keys: dict[str, threading.Lock] = {}
        self._this_run: dict[str, str] = {}  # worker crashes and timeouts, not kept on disk

    def cost(self, task: Task, case: Case, spec: CaseSpec, gen: TpuGeneration) -> XlaProgramCost | str:
        if self.libtpu is None:
            return NO_LIBTPU
        key = self.key(task, spec, gen)
        hit = self._known(key)
        if hit is not None:
            return hit
        with self._lock:
            key_lock = self._keys.setdefault(key, threading.Lock())
            if self._pool is None:
                self._pool = WorkerPool(BACKENDS["tpu-compile"], size=self._workers, limits=self.limits)
        with key_lock:  # the same reference asked twice at once is compiled once
            hit = self._known(key)
            if hit is None:
                hit, keep = self._compile(task, case, spec, gen)
                if keep:
                    self.cache.put(key, hit)
                else:
                    self._this_run[key] = hit
            return hit

    def _known(self, key: str) -> XlaProgramCost | str | None:
        """What an earlier compile said, unless it is an error to be tried again."""
        hit = self.cache.get(key)
        if isinstance(hit, str) and self.retry_errors:
            return None
        return hit if hit is not None else self._this_run.get(key)

    def key(self, task: Task, spec: CaseSpec, gen: TpuGeneration) -> str:
        """What a compiled cost is kept under: the reference's code, the case, the topology and
        the compiler's versions."""
        import jax

        return self.cache.key(self.digest(task), spec.name, spec.args, gen.topology, jax.__version__, self.libtpu)

    def _compile(self, task: Task, case: Case, spec: CaseSpec, gen: TpuGeneration
                 ) -> tuple[XlaProgramCost | str, bool]:
        """(the cost or why there is none, whether the answer is the compiler's own and so kept)."""
        request = ReferenceCost(task.name, spec, gen.topology)
        if task.external is not None:
            request.reference_source, request.reference_function, request.reference_args = (
                task.external.timing_reference(case))
        assert self._pool is not None
        with self._pool.lease() as worker:
            try:
                reply, _ = worker.call(request, what=f"compiling the reference of {task.name} at {spec.name} "
                                                     f"for {gen.name}")
            except WorkerError as exc:  # a libtpu crash or a compile over the limit: said for this run only
                worker.kill()
                return f"compiling the reference for {gen.name} failed: {exc}", False
        if isinstance(reply, Costed):
            return XlaProgramCost(**reply.cost), True
        return (f"XLA could not compile the reference for {gen.name}: {reply.error_type}: "
                f"{reply.error.splitlines()[0] if reply.error else ''}"), True

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None
