"""gemm_rmsnorm: rms_norm(x[M, K] @ w[K, N]) * scale[N], the norm over N, eps 1e-6, in float32."""
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from tasks.spec import MXU_TOLERANCES, ArgSpec, Case, Task, case_grid, normal, np_dtype
from tasks.stresses import small_scale

_DTYPES = ("float32", "bfloat16")
EPS = 1e-6


def reference(x, w, scale):
    y = jnp.dot(x.astype(jnp.float32), w.astype(jnp.float32), precision=lax.Precision.HIGHEST)
    ms = jnp.mean(y * y, axis=-1, keepdims=True)
    return (y * jax.lax.rsqrt(ms + EPS) * scale.astype(jnp.float32)).astype(x.dtype)


def arg_specs(case: Case) -> list[ArgSpec]:
    d = case.dims
    return [ArgSpec((d["m"], d["k"]), case.dtype), ArgSpec((d["k"], d["n"]), case.dtype),
            ArgSpec((d["n"],), case.dtype)]


def out_specs(case: Case) -> list[ArgSpec]:
    return [ArgSpec((case.dims["m"], case.dims["n"]), case.dtype)]


def make_inputs(case: Case, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    x_spec, w_spec, s_spec = arg_specs(case)
    # Rows of x have magnitudes from 0.2 to 3, so each row of x @ w has its own RMS and a kernel
    # that skips the normalisation (or normalises by the wrong count) is far off; w is scaled by
    # 1/sqrt(K), and the scale is far from all-ones.
    row_scale = rng.uniform(0.2, 3.0, size=(x_spec.shape[0], 1)).astype(np.float32)
    x = rng.standard_normal(x_spec.shape, dtype=np.float32) * row_scale
    return (x.astype(np_dtype(case.dtype)),
            normal(rng, w_spec.shape, case.dtype, scale=case.dims["k"] ** -0.5),
            normal(rng, s_spec.shape, case.dtype, scale=0.3, shift=1.0))


CASES = (
    case_grid("train", "check", [dict(m=512, k=1024, n=256), dict(m=140, k=448, n=320)], _DTYPES)
    # Held-out shapes differ in kind: unaligned in every dim (the mean square must use the true
    # N, not the padded one), a single row with a long K loop.
    + case_grid("heldout", "check", [dict(m=200, k=300, n=200), dict(m=1, k=1536, n=384)], _DTYPES)
    + case_grid("train", "bench", [dict(m=4096, k=4096, n=4096)], _DTYPES)
    + case_grid("heldout", "bench", [dict(m=3000, k=5000, n=3000)], _DTYPES)
)

TASK = Task(
    name="gemm_rmsnorm",
    version=2,
    level=2,
    description=("Fused GEMM + RMS norm: rms_norm(x @ w) * scale, normalised over the N axis "
                 "(eps=1e-6), f32 accumulation and norm; output in x.dtype."),
    signature="kernel(x[M, K], w[K, N], scale[N]) -> [M, N]",
    reference=reference,
    arg_specs=arg_specs,
    make_inputs=make_inputs,
    out_specs=out_specs,
    cases=tuple(CASES),
    solution_path=Path(__file__).with_name("solution.py"),
    tolerances=dict(MXU_TOLERANCES),
    stresses=(small_scale(make_inputs, which=(0,)),),
)
