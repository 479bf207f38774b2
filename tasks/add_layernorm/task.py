"""add_layernorm: layer_norm(x + residual) * gamma + beta over the last axis, eps 1e-5, in f32.

The variance is the biased one (mean of squared deviations), as in torch.nn.LayerNorm.

The train bench's d=4096 is GPT-J-6B's n_embd (the width of its LayerNorms).
Shapes from: GPT-J-6B.
"""
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from tasks.spec import ArgSpec, Case, Task, activation_shape, case_grid, normal, np_dtype
from tasks.stresses import large_offset, small_scale

_DTYPES = ("float32", "bfloat16")
EPS = 1e-5


def reference(x, residual, gamma, beta):
    s = x.astype(jnp.float32) + residual.astype(jnp.float32)
    mean = jnp.mean(s, axis=-1, keepdims=True)
    var = jnp.mean((s - mean) ** 2, axis=-1, keepdims=True)
    y = (s - mean) * jax.lax.rsqrt(var + EPS)
    return (y * gamma.astype(jnp.float32) + beta.astype(jnp.float32)).astype(x.dtype)


def arg_specs(case: Case) -> list[ArgSpec]:
    vec = ArgSpec((case.dims["d"],), case.dtype)
    return [ArgSpec(activation_shape(case), case.dtype), ArgSpec(activation_shape(case), case.dtype), vec, vec]


def out_specs(case: Case) -> list[ArgSpec]:
    return [ArgSpec(activation_shape(case), case.dtype)]


def make_inputs(case: Case, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    x_spec, r_spec, g_spec, b_spec = arg_specs(case)
    # Every row of x has its own offset (-3..3) and spread (0.5..3), so skipping the mean, the
    # variance or the residual is far off; gamma is far from ones and beta from zeros.
    shape = activation_shape(case)
    rows = shape[:-1] + (1,)
    x = (rng.standard_normal(shape, dtype=np.float32) * rng.uniform(0.5, 3.0, size=rows)
         + rng.uniform(-3.0, 3.0, size=rows))
    return (x.astype(np_dtype(case.dtype)),
            normal(rng, r_spec.shape, case.dtype),
            normal(rng, g_spec.shape, case.dtype, scale=0.3, shift=1.0),
            normal(rng, b_spec.shape, case.dtype, scale=0.5))


CASES = (
    case_grid("train", "check", [dict(rows=512, d=768), dict(b=2, s=300, d=448)], _DTYPES)
    # Held-out shapes differ in kind: unaligned d with a ragged last row block, a single row.
    + case_grid("heldout", "check", [dict(b=3, s=100, d=1000), dict(b=1, s=1, d=640)], _DTYPES)
    + case_grid("train", "bench", [dict(rows=16384, d=4096)], _DTYPES)
    + case_grid("heldout", "bench", [dict(b=4, s=2000, d=2500)], _DTYPES)
)

TASK = Task(
    name="add_layernorm",
    version=2,
    level=2,
    description=("Fused residual add + LayerNorm: layer_norm(x + residual) * gamma + beta over "
                 "the last axis (biased variance, eps=1e-5) in float32; output in x.dtype."),
    signature="kernel(x[..., d], residual[..., d], gamma[d], beta[d]) -> [..., d]",
    reference=reference,
    arg_specs=arg_specs,
    make_inputs=make_inputs,
    out_specs=out_specs,
    cases=tuple(CASES),
    solution_path=Path(__file__).with_name("solution.py"),
    heldout_task=True,
    stresses=(large_offset(make_inputs), small_scale(make_inputs, which=(0, 1))),
)
