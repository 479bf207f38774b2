"""gemm_bias_gelu: gelu_tanh(x[M, K] @ w[K, N] + b[N]) -> [M, N], computed in float32."""
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from tasks.spec import MXU_TOLERANCES, ArgSpec, Case, Task, case_grid, normal

_DTYPES = ("float32", "bfloat16")


def reference(x, w, b):
    y = jnp.dot(x.astype(jnp.float32), w.astype(jnp.float32), precision=lax.Precision.HIGHEST)
    y = y + b.astype(jnp.float32)
    return jax.nn.gelu(y, approximate=True).astype(x.dtype)


def arg_specs(case: Case) -> list[ArgSpec]:
    d = case.dims
    return [ArgSpec((d["m"], d["k"]), case.dtype), ArgSpec((d["k"], d["n"]), case.dtype),
            ArgSpec((d["n"],), case.dtype)]


def out_specs(case: Case) -> list[ArgSpec]:
    return [ArgSpec((case.dims["m"], case.dims["n"]), case.dtype)]


def make_inputs(case: Case, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    x_spec, w_spec, b_spec = arg_specs(case)
    # w scaled by 1/sqrt(K) so the pre-activation is O(1) whatever K is: GELU is then in its
    # curved region (neither the identity nor zero), and a bias of std 0.5 shifts it visibly.
    return (normal(rng, x_spec.shape, case.dtype),
            normal(rng, w_spec.shape, case.dtype, scale=case.dims["k"] ** -0.5),
            normal(rng, b_spec.shape, case.dtype, scale=0.5))


CASES = (
    case_grid("train", "check", [dict(m=512, k=1024, n=512), dict(m=260, k=320, n=448)], _DTYPES)
    # Held-out shapes differ in kind: unaligned in every dim, a single row.
    + case_grid("heldout", "check", [dict(m=200, k=300, n=136), dict(m=1, k=640, n=256)], _DTYPES)
    + case_grid("train", "bench", [dict(m=4096, k=4096, n=4096)], _DTYPES)
    + case_grid("heldout", "bench", [dict(m=3000, k=5000, n=1000)], _DTYPES)
)

TASK = Task(
    name="gemm_bias_gelu",
    version=2,
    level=2,
    description=("Fused linear layer: gelu(x @ w + b) with the tanh GELU approximation, f32 "
                 "accumulation and epilogue; output in x.dtype."),
    signature="kernel(x[M, K], w[K, N], b[N]) -> [M, N]",
    reference=reference,
    arg_specs=arg_specs,
    make_inputs=make_inputs,
    out_specs=out_specs,
    cases=tuple(CASES),
    solution_path=Path(__file__).with_name("solution.py"),
    tolerances=dict(MXU_TOLERANCES),
)
