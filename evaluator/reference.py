"""Host-side truth: seeded inputs, reference outputs and reference costs for a task's cases.

Runs in the trusted host process (on the CPU), never in a worker: candidates cannot reach
the reference or the expected outputs.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

import numpy as np

from tasks.spec import Case, Task

if TYPE_CHECKING:
    from evaluator.jaxpr_cost import Cost


def _jax():
    import jax

    jax.config.update("jax_platforms", "cpu")  # the host must never claim a TPU its workers need
    return jax


def case_seeds(base_seed: int, case_index: int, n_seeds: int) -> list[int]:
    """Distinct, reproducible seeds for one case, derived from the grading's base seed."""
    seq = np.random.SeedSequence([base_seed, case_index])
    return [int(s.generate_state(1)[0] & 0x7FFFFFFF) for s in seq.spawn(n_seeds)]


class ReferenceCache:
    """Caches jitted references, FLOP counts and the last few (inputs, outputs) per seed;
    thread-safe. Graders that reuse a seed for one task (data_gen grades every mutant of a task
    on the same inputs) then compute each reference output once."""

    RECENT = 64  # (task, case, seed) entries kept: check-size arrays, a few MB each at most

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._jitted: dict[tuple, Any] = {}
        self._costs: dict[tuple, Cost] = {}
        self._recent: OrderedDict[tuple, tuple[tuple[np.ndarray, ...], list[np.ndarray],
                                               list[np.ndarray]]] = OrderedDict()

    def inputs(self, task: Task, case: Case, seed: int) -> tuple[np.ndarray, ...]:
        return self._entry(task, case, seed)[0]

    def outputs_for(self, task: Task, case: Case, seed: int) -> list[np.ndarray]:
        return self._entry(task, case, seed)[1]

    def tpu_outputs_for(self, task: Task, case: Case, seed: int) -> list[np.ndarray]:
        """The reference's outputs with its dots rounded as a TPU rounds them (compare.py)."""
        return self._entry(task, case, seed)[2]

    def _entry(self, task: Task, case: Case, seed: int) -> tuple[tuple[np.ndarray, ...], list[np.ndarray],
                                                                  list[np.ndarray]]:
        key = (*_identity(task), case.name, seed)
        with self._lock:
            if key in self._recent:
                self._recent.move_to_end(key)
                return self._recent[key]
        if task.external is not None:  # third-party code: inputs and outputs come from its sandbox
            inputs, outputs = task.external.sample(case, seed)
        else:
            inputs = task.make_inputs(case, np.random.default_rng(seed))
            outputs = self.outputs(task, case, inputs)
        for a in inputs:
            a.flags.writeable = False  # shared between gradings: nobody may change them
        entry = (inputs, outputs, self.outputs(task, case, inputs, tpu_dots=True))
        with self._lock:
            self._recent[key] = entry
            while len(self._recent) > self.RECENT:
                self._recent.popitem(last=False)
        return entry

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
        from evaluator.jaxpr_cost import total_cost

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

    def _reference_fn(self, task: Task, tpu_dots: bool) -> Any:
        from evaluator.program import with_tpu_dots

        key = (*_identity(task), tpu_dots)
        with self._lock:
            if key not in self._jitted:
                self._jitted[key] = _jax().jit(with_tpu_dots(task.reference) if tpu_dots else task.reference)
            return self._jitted[key]


def _identity(task: Task) -> tuple:
    """What the cached values depend on: a replaced Task (another reference, input maker or
    third-party reference under the same name) never shares an entry with the one it replaced."""
    return task.name, task.version, task.reference, task.make_inputs, id(task.external)


def _is_float(dtype: str) -> bool:
    return dtype in ("float32", "bfloat16", "float16", "float64")


def _upcast(a: np.ndarray) -> np.ndarray:
    return a.astype(np.float32) if _is_float(a.dtype.name) else a
