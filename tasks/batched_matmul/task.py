"""batched_matmul: a[B, M, K] @ b[B, K, N] -> [B, M, N] in a.dtype, accumulated in float32."""
from pathlib import Path

import jax.numpy as jnp
import numpy as np

from tasks.spec import MXU_TOLERANCES, ArgSpec, Case, Task, case_grid, normal

_DTYPES = ("float32", "bfloat16")


def reference(a, b):
    return jnp.einsum("bmk,bkn->bmn", a, b, preferred_element_type=jnp.float32).astype(a.dtype)


def arg_specs(case: Case) -> list[ArgSpec]:
    d = case.dims
    return [ArgSpec((d["b"], d["m"], d["k"]), case.dtype),
            ArgSpec((d["b"], d["k"], d["n"]), case.dtype)]


def out_specs(case: Case) -> list[ArgSpec]:
    d = case.dims
    return [ArgSpec((d["b"], d["m"], d["n"]), case.dtype)]


def make_inputs(case: Case, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    a_spec, b_spec = arg_specs(case)
    # b scaled by 1/sqrt(K) so every output element is O(1); every batch entry has its own
    # data, so a kernel that reuses one batch's b (or a) for all of them fails.
    return (normal(rng, a_spec.shape, case.dtype),
            normal(rng, b_spec.shape, case.dtype, scale=case.dims["k"] ** -0.5))


CASES = (
    # Several batch entries; the second spans two K tiles.
    case_grid("train", "check", [dict(b=4, m=128, k=256, n=256), dict(b=2, m=180, k=576, n=320)],
              _DTYPES)
    # Held-out shapes differ in kind: batch 1 with unaligned dims, single-row matrices.
    + case_grid("heldout", "check", [dict(b=1, m=200, k=300, n=136), dict(b=5, m=1, k=640, n=384)],
                _DTYPES)
    + case_grid("train", "bench", [dict(b=8, m=2048, k=2048, n=2048)], _DTYPES)
    + case_grid("heldout", "bench", [dict(b=3, m=3000, k=1000, n=5000)], _DTYPES)
)

TASK = Task(
    name="batched_matmul",
    version=2,
    level=1,
    description=("Batched matrix multiply, one independent matmul per batch entry; float32 "
                 "accumulation, output in a.dtype."),
    signature="kernel(a[B, M, K], b[B, K, N]) -> [B, M, N]",
    reference=reference,
    arg_specs=arg_specs,
    make_inputs=make_inputs,
    out_specs=out_specs,
    cases=tuple(CASES),
    solution_path=Path(__file__).with_name("solution.py"),
    tolerances=dict(MXU_TOLERANCES),
    required_features=("parallel_grid",),
)
