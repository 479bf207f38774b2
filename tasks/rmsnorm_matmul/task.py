"""rmsnorm_matmul: (rms_norm(x[M, D]) * scale[D]) @ w[D, N] -> [M, N], eps 1e-6, in float32.

The train bench's d=4096 is Llama-2-7B's and Llama-3-8B's hidden_size and n=4096 the width of
their q_proj (32 heads x 128): the input norm followed by the query projection.
Shapes from: Llama-2-7B, Llama-3-8B.
"""
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from tasks.spec import MXU_TOLERANCES, ArgSpec, Case, Task, case_grid, normal, np_dtype
from tasks.stresses import small_scale

_DTYPES = ("float32", "bfloat16")
EPS = 1e-6


def reference(x, scale, w):
    xf = x.astype(jnp.float32)
    ms = jnp.mean(xf * xf, axis=-1, keepdims=True)
    normed = xf * jax.lax.rsqrt(ms + EPS) * scale.astype(jnp.float32)
    return jnp.dot(normed, w.astype(jnp.float32), precision=lax.Precision.HIGHEST).astype(x.dtype)


def arg_specs(case: Case) -> list[ArgSpec]:
    d = case.dims
    return [ArgSpec((d["m"], d["d"]), case.dtype), ArgSpec((d["d"],), case.dtype),
            ArgSpec((d["d"], d["n"]), case.dtype)]


def out_specs(case: Case) -> list[ArgSpec]:
    return [ArgSpec((case.dims["m"], case.dims["n"]), case.dtype)]


def make_inputs(case: Case, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    x_spec, s_spec, w_spec = arg_specs(case)
    # Rows of x have magnitudes from 0.2 to 3 and a non-zero mean, so skipping the norm (or
    # dividing by the wrong count) is far off; the scale is far from all-ones; w is scaled by
    # 1/sqrt(D) so the output is O(1).
    row_scale = rng.uniform(0.2, 3.0, size=(x_spec.shape[0], 1)).astype(np.float32)
    x = (rng.standard_normal(x_spec.shape, dtype=np.float32) + 0.3) * row_scale
    return (x.astype(np_dtype(case.dtype)),
            normal(rng, s_spec.shape, case.dtype, scale=0.3, shift=1.0),
            normal(rng, w_spec.shape, case.dtype, scale=case.dims["d"] ** -0.5))


CASES = (
    case_grid("train", "check", [dict(m=256, d=1024, n=1024), dict(m=140, d=448, n=320)], _DTYPES)
    # Held-out shapes differ in kind: unaligned in every dim (the mean square must use the true
    # D, not the padded one), a single row with a long D walk.
    + case_grid("heldout", "check", [dict(m=200, d=600, n=136), dict(m=1, d=2048, n=384)],
                _DTYPES)
    + case_grid("train", "bench", [dict(m=8192, d=4096, n=4096)], _DTYPES)
    + case_grid("heldout", "bench", [dict(m=3000, d=5000, n=1000)], _DTYPES)
)

TASK = Task(
    name="rmsnorm_matmul",
    version=2,
    level=2,
    description=("Fused RMS norm + projection: (rms_norm(x) * scale) @ w, norm over D with "
                 "eps=1e-6 in float32, f32 accumulation; output in x.dtype."),
    signature="kernel(x[M, D], scale[D], w[D, N]) -> [M, N]",
    reference=reference,
    arg_specs=arg_specs,
    make_inputs=make_inputs,
    out_specs=out_specs,
    cases=tuple(CASES),
    solution_path=Path(__file__).with_name("solution.py"),
    tolerances=dict(MXU_TOLERANCES),
    stresses=(small_scale(make_inputs, which=(0,)),),
)
