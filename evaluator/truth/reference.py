"""Host-side truth: seeded inputs, reference outputs and reference costs for a task's cases.

Runs in the trusted host process (on the CPU), never in a worker: candidates cannot reach
the reference or the expected outputs.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np

from evaluator.truth.stress import perturbed
from tasks.spec import Case, Task

if TYPE_CHECKING:
    from evaluator.analysis.jaxpr_cost import Cost


def _jax():
    import jax

    jax.config.update("jax_platforms", "cpu")  # the host must never claim a TPU its workers need
    return jax


def case_seeds(base_seed: int, case_index: int, n_seeds: int) -> list[int]:
    """Distinct, reproducible seeds for one case, derived from the grading's base seed."""
    seq = np.random.SeedSequence([base_seed, case_index])
    return [int(s.generate_state(1)[0] & 0x7FFFFFFF) for s in seq.spawn(n_seeds)]


@dataclass
class _Slot:
    """One cached value, computed once even when two threads ask at the same time."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    value: Any = None


class ReferenceCache:
    """Caches jitted references, FLOP counts and the last few inputs and outputs per seed;
    thread-safe, and each value is computed once: the run stage asks for a case's inputs,
    then (on another thread, while the worker runs) for its expected outputs and the next
    case's. Graders that reuse a seed for one task (data_gen grades every mutant of a task on
    the same inputs) compute each reference output once."""

    RECENT = 64  # (task, case, seed) entries kept: check-size arrays, a few MB each at most

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._jitted: dict[tuple, Any] = {}
        self._costs: dict[tuple, Cost] = {}
        self._inputs: OrderedDict[tuple, _Slot] = OrderedDict()   # (inputs, their sampled outputs or None)
        self._outputs: OrderedDict[tuple, _Slot] = OrderedDict()  # (outputs, TPU-rounded outputs)
        self._ahead = ThreadPoolExecutor(max_workers=1, thread_name_prefix="references-ahead")

    def ahead(self, task: Task, costed: Sequence[Case], plan: Sequence[tuple[Case, Sequence[int]]]
              ) -> list[Future]:
        """Start making, on a background thread, what a grading will ask for: the reference's
        cost at each case of `costed` (the structure stage's first question), then each case's
        inputs and expected outputs for its seeds (`plan`, the run stage's). The host has
        nothing else to do while its worker loads, traces and lowers the candidate; the stages
        then find these values made, or wait for the one being made. A value that fails is
        made again, and its error raised, by the stage that asks. Cancel the futures when the
        grading ends: what has not started by then is not made."""
        def quietly(make: Callable[[], Any]) -> Callable[[], None]:
            def run() -> None:
                try:
                    make()
                except Exception:  # noqa: BLE001  (the stage that asks again raises it)
                    pass
            return run

        jobs = [quietly(lambda c=c: self.cost(task, c)) for c in costed]
        jobs += [quietly(lambda c=c, s=s: self._expected(task, c, s)) for c, seeds in plan for s in seeds]
        return [self._ahead.submit(job) for job in jobs]

    def inputs(self, task: Task, case: Case, seed: int) -> tuple[np.ndarray, ...]:
        return self._sample(task, case, seed)[0]

    def outputs_for(self, task: Task, case: Case, seed: int) -> list[np.ndarray]:
        return self._expected(task, case, seed)[0]

    def tpu_outputs_for(self, task: Task, case: Case, seed: int) -> list[np.ndarray]:
        """The reference's outputs with its dots rounded as a TPU rounds them (compare.py)."""
        return self._expected(task, case, seed)[1]

    def sensitivity_for(self, task: Task, case: Case, seed: int) -> list[np.ndarray | None] | None:
        """For a stress case, how far one float32 ulp of every input moves each of the
        reference's float outputs (evaluator/truth/stress.py); None for other cases and outputs."""
        return self._expected(task, case, seed)[2]

    def _sample(self, task: Task, case: Case, seed: int) -> tuple[tuple[np.ndarray, ...], list[np.ndarray] | None]:
        def make() -> tuple[tuple[np.ndarray, ...], list[np.ndarray] | None]:
            if task.external is not None:  # third-party code: inputs and outputs come from its sandbox
                inputs, outputs = task.external.sample(case, seed)
            else:
                inputs, outputs = task.inputs(case, np.random.default_rng(seed)), None
            for a in inputs:
                a.flags.writeable = False  # shared between gradings: nobody may change them
            return tuple(inputs), outputs

        return self._once(self._inputs, (*_identity(task), case.name, seed), make)

    def _expected(self, task: Task, case: Case, seed: int
                  ) -> tuple[list[np.ndarray], list[np.ndarray], list[np.ndarray | None] | None]:
        def make() -> tuple[list[np.ndarray], list[np.ndarray], list[np.ndarray | None] | None]:
            inputs, sampled = self._sample(task, case, seed)
            if task.external is not None:
                return sampled, self.outputs(task, case, inputs, tpu_dots=True), None
            # Both in one program: one compile, and what the two share is computed once.
            exact, tpu = self._reference_fn(task, tpu_dots=None)(*[_upcast(a) for a in inputs])
            leaves = _jax().tree_util.tree_leaves
            exact = [np.asarray(x) for x in leaves(exact)]
            spread = None
            if case.stress:
                moved = self.outputs(task, case, perturbed(inputs, np.random.default_rng(seed)))
                # an integer output (an argmax) has no rounding to allow for: a moved tie is not one
                spread = [np.abs(m.astype(np.float64) - e.astype(np.float64)) if _is_float(e.dtype.name) else None
                          for m, e in zip(moved, exact)]
            return exact, [np.asarray(x) for x in leaves(tpu)], spread

        return self._once(self._outputs, (*_identity(task), case.name, seed), make)

    def _once(self, store: OrderedDict[tuple, _Slot], key: tuple, make: Callable[[], Any]) -> Any:
        with self._lock:
            slot = store.get(key)
            if slot is None:
                slot = store[key] = _Slot()
                while len(store) > self.RECENT:
                    store.popitem(last=False)
            store.move_to_end(key)
        with slot.lock:
            if slot.value is None:
                slot.value = make()
            return slot.value

    def outputs(self, task: Task, case: Case, inputs: tuple[np.ndarray, ...],
                tpu_dots: bool = False) -> list[np.ndarray]:
        """Reference outputs computed in float32 on float32-upcast inputs, as a flat list; with
        `tpu_dots`, its DEFAULT-precision dots rounded as a TPU rounds them."""
        if task.external is not None:
            return task.external.outputs(case, inputs, tpu_dots)
        jax = _jax()
        fn = self._reference_fn(task, tpu_dots)
        result = fn(*[_upcast(a) for a in inputs])
        return [np.asarray(leaf) for leaf in jax.tree_util.tree_leaves(result)]

    def flops(self, task: Task, case: Case) -> float:
        return self.cost(task, case).flops

    def cost(self, task: Task, case: Case) -> Cost:
        """What the reference computes at a case (FLOPs, of which matmul FLOPs), traced on
        float32-upcast inputs like the outputs."""
        from evaluator.analysis.jaxpr_cost import total_cost

        if task.external is not None:
            return task.external.cost(case)
        key = (*_identity(task), case.name)
        with self._lock:
            if key in self._costs:
                return self._costs[key]
        jax = _jax()
        specs = [jax.ShapeDtypeStruct(a.shape, "float32" if _is_float(a.dtype) else a.dtype)
                 for a in task.arg_specs(case)]
        value = total_cost(jax.make_jaxpr(task.reference)(*specs), task.arg_bounds(case))
        with self._lock:
            self._costs[key] = value
        return value

    def _reference_fn(self, task: Task, tpu_dots: bool | None) -> Any:
        """The jitted reference; with `tpu_dots` its dots rounded as a TPU rounds them, and
        with None a function of both: (exact outputs, TPU-rounded outputs)."""
        from evaluator.execution.program import REFERENCE_COMPILE_OPTIONS, with_tpu_dots

        key = (*_identity(task), tpu_dots)
        with self._lock:
            if key not in self._jitted:
                fn = {False: task.reference, True: with_tpu_dots(task.reference),
                      None: lambda *a: (task.reference(*a), with_tpu_dots(task.reference)(*a))}[tpu_dots]
                self._jitted[key] = _jax().jit(fn, compiler_options=REFERENCE_COMPILE_OPTIONS)
            return self._jitted[key]


def _identity(task: Task) -> tuple:
    """What the cached values depend on: a replaced Task (another reference, input maker or
    third-party reference under the same name) never shares an entry with the one it replaced."""
    return task.name, task.version, task.reference, task.make_inputs, id(task.external)


def _is_float(dtype: str) -> bool:
    return dtype in ("float32", "bfloat16", "float16", "float64")


def _upcast(a: np.ndarray) -> np.ndarray:
    return a.astype(np.float32) if _is_float(a.dtype.name) else a
