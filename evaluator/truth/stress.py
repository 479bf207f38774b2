"""Stress cases: every candidate on each of its task's input regimes (tasks.spec.Stress).

Default inputs are standard-normal-like, and code that fails only on the values real data has
passes on them: a one-pass variance with a mean of 2, a softmax without its running max on
logits of 10, an argmax that takes the last of equal maxima when no two are equal. A task
declares the regimes its inputs lack; the run stage checks each at a check size, in every dtype
of the split's check cases: one case per regime and dtype, made from the split's largest check
case of that dtype (at the sizes the regime names, where it names any). At the check case's own
sizes it runs the program traced there, on the regime's inputs: no second trace, no second
compile.

The tolerance. Under stress the reference's own float32 arithmetic may be far from the truth
(a mean of 300 taken out of rows with a spread of 1 keeps few of float32's digits), and an
honest kernel computing in another order lands about as far from it. So the reference runs once
more on its inputs each moved by one float32 ulp, up or down at random (the rounding a float32
computation commits): each element's bound widens by SENSITIVITY_MULTIPLE times how far that
moves it, and the relative-L2 bound by as many times the relative L2 of the move. A kernel that
fails there fails by far more than rounding: the one-pass variance loses every digit, the
softmax without its max overflows to NaN.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from evaluator.analysis.coverage import elements
from tasks.spec import Case, Task

# How many times the reference's own one-ulp movement a kernel's error may reach, per element
# and in relative L2: rounding at every step of a computation, in another order than the
# reference's, is a few ulps per step of its conditioning.
SENSITIVITY_MULTIPLE = 8.0
_ULP = 2.0 ** -23  # of float32: what one rounding moves a value by, relative
_SHORT = {"float32": "f32", "bfloat16": "bf16"}


def stress_cases(task: Task, split: str) -> list[tuple[Case, Case]]:
    """(stress case, the check case whose traced program it runs) for each of the task's regimes
    and each dtype of the split's check cases, from the largest check case of that dtype (the
    most rows for a regime to go wrong in); a regime at sizes of its own runs its own program
    (the pair holds the case twice)."""
    checks = task.select(split, "check")
    out = []
    for stress in task.stresses:
        for dtype in sorted({c.dtype for c in checks}):
            base = max((c for c in checks if c.dtype == dtype), key=lambda c: (elements(task, c), c.name))
            dims = {**base.dims, **stress.dims}
            label = "_".join(f"{k}{v}" for k, v in dims.items())
            case = dataclasses.replace(
                base, name=f"{base.split}_stress_{stress.name}_{label}_{_SHORT.get(dtype, dtype)}", dims=dims,
                stress=stress.name)
            out.append((case, base if dims == base.dims else case))
    return out


def perturbed(inputs: tuple[np.ndarray, ...], rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    """The inputs, float ones upcast to float32 and each element moved by one float32 ulp up or
    down at random; integer inputs (lengths, indices) as they are."""
    out = []
    for a in inputs:
        if np.issubdtype(a.dtype, np.integer) or a.dtype == np.bool_:
            out.append(a)
            continue
        x = a.astype(np.float32)
        out.append((x * (1.0 + _ULP * rng.choice(np.array([-1.0, 1.0], np.float32), size=x.shape))).astype(np.float32))
    return tuple(out)


def describe(task: Task, case: Case) -> str:
    """For feedback on a failing stress case: which regime, and what it tests."""
    found = [s for s in task.stresses if s.name == case.stress]
    if not found:
        return ""
    return (f" Case {case.name} runs the task's inputs in the regime '{case.stress}' ({found[0].description}), "
            "values real data has and the other cases lack: look for arithmetic that holds only for small, "
            "centred or distinct values.")
