"""geglu: gelu(x[M, D] @ w1[D, F]) * (x @ w2[D, F]) -> [M, F], exact (erf) GELU, in float32.

The train bench's d=4096, f=11008 are Llama-2-7B's hidden_size and intermediate_size (its MLP
gates with SiLU, not GELU).
Shapes from: Llama-2-7B.
"""
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from tasks.spec import GATED_MXU_TOLERANCES, ArgSpec, Case, Task, case_grid, normal

_DTYPES = ("float32", "bfloat16")
_HI = lax.Precision.HIGHEST


def reference(x, w1, w2):
    out_dtype = x.dtype
    x, w1, w2 = (a.astype(jnp.float32) for a in (x, w1, w2))
    a = jnp.dot(x, w1, precision=_HI)
    return (jax.nn.gelu(a, approximate=False) * jnp.dot(x, w2, precision=_HI)).astype(out_dtype)


def arg_specs(case: Case) -> list[ArgSpec]:
    d = case.dims
    return [ArgSpec((d["m"], d["d"]), case.dtype), ArgSpec((d["d"], d["f"]), case.dtype),
            ArgSpec((d["d"], d["f"]), case.dtype)]


def out_specs(case: Case) -> list[ArgSpec]:
    return [ArgSpec((case.dims["m"], case.dims["f"]), case.dtype)]


def make_inputs(case: Case, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    x_spec, w1_spec, w2_spec = arg_specs(case)
    # Both projections scaled by 1/sqrt(D) are O(1): GELU in its curved region, output O(0.5).
    scale = case.dims["d"] ** -0.5
    return (normal(rng, x_spec.shape, case.dtype),
            normal(rng, w1_spec.shape, case.dtype, scale=scale),
            normal(rng, w2_spec.shape, case.dtype, scale=scale))


CASES = (
    case_grid("train", "check", [dict(m=256, d=1024, f=512), dict(m=260, d=320, f=448)], _DTYPES)
    # Held-out shapes differ in kind: unaligned in every dim, a single row with a long D walk.
    + case_grid("heldout", "check", [dict(m=200, d=300, f=700), dict(m=1, d=1536, f=256)],
                _DTYPES)
    + case_grid("train", "bench", [dict(m=4096, d=4096, f=11008)], _DTYPES)
    + case_grid("heldout", "bench", [dict(m=3000, d=1000, f=2730)], _DTYPES)
)

TASK = Task(
    name="geglu",
    version=2,
    level=2,
    description=("Fused GEGLU: gelu(x @ w1) * (x @ w2) with the exact (erf) GELU, f32 "
                 "accumulation and epilogue; output in x.dtype."),
    signature="kernel(x[M, D], w1[D, F], w2[D, F]) -> [M, F]",
    reference=reference,
    arg_specs=arg_specs,
    make_inputs=make_inputs,
    out_specs=out_specs,
    cases=tuple(CASES),
    solution_path=Path(__file__).with_name("solution.py"),
    tolerances=dict(GATED_MXU_TOLERANCES),
    heldout_task=True,
)
