"""matmul_transposed: x[M, K] @ w[N, K]^T -> [M, N] in x.dtype, accumulated in float32.

The second operand is stored [N, K] (as nn.Linear weights are), so the kernel contracts the
minor dims of both operands.
"""
from pathlib import Path

import jax.numpy as jnp
import numpy as np

from tasks.spec import MXU_TOLERANCES, ArgSpec, Case, Task, case_grid, normal

_DTYPES = ("float32", "bfloat16")


def reference(x, w):
    return jnp.dot(x, w.T, preferred_element_type=jnp.float32).astype(x.dtype)


def arg_specs(case: Case) -> list[ArgSpec]:
    d = case.dims
    return [ArgSpec((d["m"], d["k"]), case.dtype), ArgSpec((d["n"], d["k"]), case.dtype)]


def out_specs(case: Case) -> list[ArgSpec]:
    return [ArgSpec((case.dims["m"], case.dims["n"]), case.dtype)]


def make_inputs(case: Case, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    x_spec, w_spec = arg_specs(case)
    # w scaled by 1/sqrt(K) so every output element is O(1) whatever K is.
    return (normal(rng, x_spec.shape, case.dtype),
            normal(rng, w_spec.shape, case.dtype, scale=case.dims["k"] ** -0.5))


CASES = (
    # Non-square shapes, so a kernel that contracts the wrong dim of w fails to trace or
    # gives wrong values; the first spans two K tiles.
    case_grid("train", "check", [dict(m=256, k=1024, n=384), dict(m=132, k=320, n=448)], _DTYPES)
    # Held-out shapes differ in kind: unaligned in every dim, a single row.
    + case_grid("heldout", "check", [dict(m=168, k=260, n=200), dict(m=1, k=640, n=136)], _DTYPES)
    + case_grid("train", "bench", [dict(m=4096, k=4096, n=4096)], _DTYPES)
    + case_grid("heldout", "bench", [dict(m=2000, k=3000, n=5000)], _DTYPES)
)

TASK = Task(
    name="matmul_transposed",
    version=2,
    level=1,
    description=("Matrix multiply with a transposed second operand, x @ w.T for w stored [N, K]; "
                 "float32 accumulation, output in x.dtype."),
    signature="kernel(x[M, K], w[N, K]) -> [M, N]",
    reference=reference,
    arg_specs=arg_specs,
    make_inputs=make_inputs,
    out_specs=out_specs,
    cases=tuple(CASES),
    solution_path=Path(__file__).with_name("solution.py"),
    tolerances=dict(MXU_TOLERANCES),
)
