"""JAXBench's references and generated kernels as their own harness timed them, for holding our
predictions against their published times (benchmarks/perf_agreement.py); gradings never use this.

Their pallas_eval harness (pallas_eval/eval_harness.py) jits `Model(*get_init_inputs()).forward`
over `get_inputs()`: the model's weights are closed over, so they reach XLA as constants, and XLA
folds what they make constant. Most of KernelBench level 2 initialises its weights to zeros, so a
matmul by them is folded away and the program their harness timed is not the one a grading
times (the weights as arguments, drawn at random). A separate module, not imported by the
adapter: the adapter's digest, which keys every imported task's verdicts, does not cover it.
"""
from __future__ import annotations

import types
from typing import Any

REFERENCE_DRIVER = True  # a worker may call its functions (evaluator/execution/handlers.py)


def harness_timed_reference(module: types.ModuleType) -> Any:
    """A KernelBench model's reference as a function of `get_inputs()` alone, its own weights
    closed over. (Their harness passes a priority workload's inputs as arguments, as we do.)"""
    return module.Model(*module.get_init_inputs()).forward


def harness_timed_candidate(module: types.ModuleType, reference_source: str) -> Any:
    """A generated KernelBench kernel as their harness timed it: its `Model` built from the
    reference's `get_init_inputs()`, its own weights closed over (XLA folds the glue around its
    Pallas calls on them, never the calls themselves)."""
    reference: dict[str, Any] = {}
    exec(compile(reference_source, "jaxbench_reference", "exec"), reference)
    return module.Model(*reference["get_init_inputs"]()).forward
