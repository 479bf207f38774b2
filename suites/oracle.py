"""The host's handle on third-party reference code: the sandboxed workers that run it.

A peer suite's reference and input maker are code nobody here wrote, so they run where
candidates run (a worker of evaluator/execution/sandbox.py: its own process group, no network, a
read-only project, an address-space cap), never in the process that holds the verdicts. The host
sends each file's text and names a function of suites/driver.py to call on it.
"""
from __future__ import annotations

import atexit
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from evaluator.analysis.jaxpr_cost import Cost
from evaluator.digest import code_digest
from evaluator.execution.backends import Backend
from evaluator.execution.protocol import Call, Failed
from evaluator.execution.sandbox import Limits, WorkerPool
from tasks.spec import Case

REFERENCE_BACKEND = Backend("suite-reference", "cpu", interpret=False, device_compile=False,
                            times_kernels=False, description="a peer suite's reference code, on the CPU")
# Tracing a bench-size reference (JAXBench's 7p unrolls 64 sequences in Python) takes a while.
REFERENCE_LIMITS = Limits(step_timeout_s=300.0)


class ReferenceFailed(RuntimeError):
    """Their code raised (or hung, or killed its worker): the file cannot be used as is."""


class ReferenceRunner:
    """Sandboxed workers shared by a suite's tasks (thread-safe): with more than one, several
    entries build at once, and a grading thread's reference runs need not wait for another's."""

    def __init__(self, limits: Limits = REFERENCE_LIMITS, workers: int = 1):
        self._pool = WorkerPool(REFERENCE_BACKEND, max(1, workers), limits)
        atexit.register(self.close)

    def call(self, source: str, function: str, args: Sequence[Any],
             arrays: Sequence[np.ndarray] = ()) -> tuple[Any, list[np.ndarray]]:
        from evaluator.execution.sandbox import WorkerError

        with self._pool.lease() as worker:
            try:
                reply, out = worker.call(Call(source, f"{DRIVER}:{function}", list(args)),
                                         list(arrays), what=f"running the suite's code ({function})")
            except WorkerError as exc:
                raise ReferenceFailed(str(exc)) from None
        if isinstance(reply, Failed):
            raise ReferenceFailed(f"{reply.error_type}: {reply.error}")
        return reply.value, out

    def close(self) -> None:
        self._pool.close()


@dataclass
class Described:
    """A case as the reference file builds it (suites/driver.py `describe`)."""

    args: list[tuple[tuple[int, ...], str]]
    names: list[str]
    n_inputs: int
    outs: list[tuple[tuple[int, ...], str]]
    cost: Cost
    init: list[Any] = field(default_factory=list)

    @classmethod
    def from_value(cls, value: dict[str, Any]) -> "Described":
        return cls([(tuple(s), d) for s, d in value["args"]], value["names"], value["n_inputs"],
                   [(tuple(s), d) for s, d in value["outs"]], Cost(**value["cost"]), value["init"])

    @property
    def elements(self) -> int:
        return sum(int(np.prod(s)) for s, _ in [*self.args, *self.outs])


def describe(runner: ReferenceRunner, source: str, kind: str, dtype: str) -> Described:
    value, _ = runner.call(source, "describe", [kind, dtype])
    return Described.from_value(value)


DRIVER = "suites.driver"  # the functions a worker runs on their files (protocol Call)
# The code that turns a suite's file into a task and runs its reference: what, besides the file
# itself, decides an imported task's verdicts (and its load records, suites/listing.py).
ADAPTER_ROOTS = ("suites.jaxbench", "suites.driver", "tasks.spec")


@dataclass
class SuiteReference:
    """One imported task's reference (tasks.spec.ExternalReference): each case's rewritten
    file, run by the shared runner. Remembers which arguments each seed had to redraw."""

    runner: ReferenceRunner
    kind: str
    dtype: str
    sources: dict[str, str]
    described: dict[str, Described]
    repaired: set[str] = field(default_factory=set)
    # (function, arguments) that build this task again in another process: set by the Suite
    # that built it (suites.open_task with its spec and the task's name)
    rebuilt_by: tuple[Any, tuple[Any, ...]] | None = None

    def code_digest(self) -> str:
        return code_digest(ADAPTER_ROOTS)

    def rebuild(self) -> tuple[Any, tuple[Any, ...]]:
        if self.rebuilt_by is None:
            raise TypeError("an imported task built outside a Suite cannot be rebuilt elsewhere")
        return self.rebuilt_by

    def sample(self, case: Case, seed: int) -> tuple[tuple[np.ndarray, ...], list[np.ndarray]]:
        value, arrays = self.runner.call(self.sources[case.name], "sample", [self.kind, self.dtype, seed])
        if value["constant_output"]:
            raise ReferenceFailed(f"the reference's output is constant at {case.name} even after "
                                  "redrawing its all-zero inputs: no kernel can be judged on it")
        self.repaired.update(value["repaired"])
        n = value["n_args"]
        return tuple(arrays[:n]), arrays[n:]

    def outputs(self, case: Case, inputs: Sequence[np.ndarray], tpu_dots: bool = False) -> list[np.ndarray]:
        n_inputs = self.described[case.name].n_inputs
        _, out = self.runner.call(self.sources[case.name], "reference", [self.kind, n_inputs, tpu_dots],
                                  inputs)
        return out

    def cost(self, case: Case) -> Cost:
        return self.described[case.name].cost

    def timing_reference(self, case: Case) -> tuple[str, str, list[Any]]:
        return self.sources[case.name], f"{DRIVER}:timed_reference", [self.kind, self.described[case.name].n_inputs]
