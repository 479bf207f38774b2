"""matmul_bf16_f32acc: x[M, K] @ y[K, N] -> float32 [M, N] (bf16 in, f32 out), f32 accumulation.

The output is float32 whatever the input dtype. Products of bf16 values are exact in float32,
so an honest kernel matches the float32 reference to accumulation-order rounding; the
bfloat16 cases get a tolerance far below one bf16 rounding, so rounding the output (or the
accumulator) to bf16 fails. The float32 cases (f32 in, f32 out) keep the default tolerance
(f32 matmuls may run in bf16 passes on the MXU).
"""
from pathlib import Path

import jax.numpy as jnp
import numpy as np

from tasks.spec import MXU_TOLERANCES, ArgSpec, Case, Task, Tolerance, case_grid, normal

_DTYPES = ("bfloat16", "float32")


def reference(x, y):
    return jnp.dot(x, y, preferred_element_type=jnp.float32).astype(jnp.float32)


def arg_specs(case: Case) -> list[ArgSpec]:
    d = case.dims
    return [ArgSpec((d["m"], d["k"]), case.dtype), ArgSpec((d["k"], d["n"]), case.dtype)]


def out_specs(case: Case) -> list[ArgSpec]:
    return [ArgSpec((case.dims["m"], case.dims["n"]), "float32")]


def make_inputs(case: Case, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    x_spec, y_spec = arg_specs(case)
    # y scaled by 1/sqrt(K) so every output element is O(1) whatever K is.
    return (normal(rng, x_spec.shape, case.dtype),
            normal(rng, y_spec.shape, case.dtype, scale=case.dims["k"] ** -0.5))


CASES = (
    # The first spans several K tiles (accumulation across grid steps matters).
    case_grid("train", "check", [dict(m=256, k=2048, n=256), dict(m=516, k=320, n=192)], _DTYPES)
    # Held-out shapes differ in kind: unaligned in every dim, a single row.
    + case_grid("heldout", "check", [dict(m=100, k=700, n=300), dict(m=1, k=1536, n=640)], _DTYPES)
    + case_grid("train", "bench", [dict(m=4096, k=4096, n=4096)], _DTYPES)
    + case_grid("heldout", "bench", [dict(m=6000, k=2000, n=3000)], _DTYPES)
)

TASK = Task(
    name="matmul_bf16_f32acc",
    version=2,
    level=1,
    description=("Matrix multiply of bf16 inputs with float32 accumulation and a float32 output "
                 "(bf16 in / f32 out; f32 inputs give f32 output too)."),
    signature="kernel(x[M, K] bf16, y[K, N] bf16) -> [M, N] float32",
    reference=reference,
    arg_specs=arg_specs,
    make_inputs=make_inputs,
    out_specs=out_specs,
    cases=tuple(CASES),
    solution_path=Path(__file__).with_name("solution.py"),
    # bf16 products are exact in f32: only f32 summation-order error remains (~1e-6).
    tolerances={"float32": MXU_TOLERANCES["float32"],
                "bfloat16": Tolerance(atol=1e-3, rtol=1e-3, rel_l2=2e-4)},
)
