"""matmul: x[M, K] @ y[K, N] -> [M, N] in x.dtype, accumulated in float32."""
from pathlib import Path

import jax.numpy as jnp
import numpy as np

from tasks.spec import MXU_TOLERANCES, ArgSpec, Case, Task, case_grid, normal

_DTYPES = ("float32", "bfloat16")


def reference(x, y):
    return jnp.dot(x, y, preferred_element_type=jnp.float32).astype(x.dtype)


def arg_specs(case: Case) -> list[ArgSpec]:
    d = case.dims
    return [ArgSpec((d["m"], d["k"]), case.dtype), ArgSpec((d["k"], d["n"]), case.dtype)]


def out_specs(case: Case) -> list[ArgSpec]:
    return [ArgSpec((case.dims["m"], case.dims["n"]), case.dtype)]


def make_inputs(case: Case, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    x_spec, y_spec = arg_specs(case)
    # y scaled by 1/sqrt(K) so every output element is O(1) whatever K is.
    return (normal(rng, x_spec.shape, case.dtype),
            normal(rng, y_spec.shape, case.dtype, scale=case.dims["k"] ** -0.5))


CASES = (
    case_grid("train", "check", [dict(m=256, k=512, n=256), dict(m=260, k=448, n=384)], _DTYPES)
    # Held-out shapes differ in kind: unaligned in every dim, a single row, a tall-skinny one.
    + case_grid("heldout", "check", [dict(m=200, k=300, n=136), dict(m=1, k=384, n=256)], _DTYPES)
    + case_grid("train", "bench", [dict(m=4096, k=4096, n=4096)], _DTYPES)
    + case_grid("heldout", "bench", [dict(m=3000, k=5000, n=1000)], _DTYPES)
)

TASK = Task(
    name="matmul",
    version=2,
    level=1,
    description="Dense matrix multiply with float32 accumulation; output in the input dtype.",
    signature="kernel(x[M, K], y[K, N]) -> [M, N]",
    reference=reference,
    arg_specs=arg_specs,
    make_inputs=make_inputs,
    out_specs=out_specs,
    cases=tuple(CASES),
    solution_path=Path(__file__).with_name("solution.py"),
    tolerances=dict(MXU_TOLERANCES),
)
