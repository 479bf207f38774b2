"""transpose_2d: x[M, N] -> x.T, [N, M], same dtype. A pure relayout: compared exactly."""
from pathlib import Path

import jax.numpy as jnp
import numpy as np

from tasks.spec import ArgSpec, Case, Task, Tolerance, case_grid, normal

_DTYPES = ("float32", "bfloat16")
_EXACT = Tolerance(atol=0.0, rtol=0.0, rel_l2=0.0)


def reference(x):
    return jnp.transpose(x)


def arg_specs(case: Case) -> list[ArgSpec]:
    return [ArgSpec((case.dims["m"], case.dims["n"]), case.dtype)]


def out_specs(case: Case) -> list[ArgSpec]:
    return [ArgSpec((case.dims["n"], case.dims["m"]), case.dtype)]


def make_inputs(case: Case, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    # Plain N(0, 1): every element distinct, so any misplaced tile or element shows.
    return (normal(rng, arg_specs(case)[0].shape, case.dtype),)


CASES = (
    # Non-square, so the output shape alone already tells M from N; several tiles.
    case_grid("train", "check", [dict(m=256, n=1024), dict(m=1030, n=320)], _DTYPES)
    # Held-out shapes differ in kind: ragged edge tiles in both dims (700 x 900), a single row.
    + case_grid("heldout", "check", [dict(m=700, n=900), dict(m=1, n=640)], _DTYPES)
    + case_grid("train", "bench", [dict(m=4096, n=4096)], _DTYPES)
    + case_grid("heldout", "bench", [dict(m=3000, n=5000)], _DTYPES)
)

TASK = Task(
    name="transpose_2d",
    version=2,
    level=1,
    description="Matrix transpose x[M, N] -> [N, M] in the input dtype.",
    signature="kernel(x[M, N]) -> [N, M]",
    reference=reference,
    arg_specs=arg_specs,
    make_inputs=make_inputs,
    out_specs=out_specs,
    cases=tuple(CASES),
    solution_path=Path(__file__).with_name("solution.py"),
    # Moving values never changes them: every element must match bit for bit.
    tolerances={"float32": _EXACT, "bfloat16": _EXACT},
)
