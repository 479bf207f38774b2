"""residual_rmsnorm: s = x + residual; returns (rms_norm(s) * scale, s), eps 1e-6, in float32.

The pre-norm transformer step: the normalised activations for the next layer and the updated
residual stream, from one pass over x and residual [..., d].

The train bench's d=4096 is Llama-2-7B's and Llama-3-8B's hidden_size (their residual stream).
Shapes from: Llama-2-7B, Llama-3-8B.
"""
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from tasks.spec import ArgSpec, Case, Task, activation_shape, case_grid, normal
from tasks.stresses import small_scale

_DTYPES = ("float32", "bfloat16")
EPS = 1e-6


def reference(x, residual, scale):
    s = x.astype(jnp.float32) + residual.astype(jnp.float32)
    ms = jnp.mean(s * s, axis=-1, keepdims=True)
    out = s * jax.lax.rsqrt(ms + EPS) * scale.astype(jnp.float32)
    return out.astype(x.dtype), s.astype(x.dtype)


def arg_specs(case: Case) -> list[ArgSpec]:
    return [ArgSpec(activation_shape(case), case.dtype), ArgSpec(activation_shape(case), case.dtype),
            ArgSpec((case.dims["d"],), case.dtype)]


def out_specs(case: Case) -> list[ArgSpec]:
    return [ArgSpec(activation_shape(case), case.dtype), ArgSpec(activation_shape(case), case.dtype)]


def make_inputs(case: Case, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    x_spec, r_spec, s_spec = arg_specs(case)
    # As in rms_norm: a non-zero mean and spread (RMS ~2, so a missing normalisation shows) and
    # a scale far from all-ones; the residual is large enough that normalising x alone, or
    # returning x as the sum, is far off.
    return (normal(rng, x_spec.shape, case.dtype, scale=2.0, shift=0.3),
            normal(rng, r_spec.shape, case.dtype, scale=1.5),
            normal(rng, s_spec.shape, case.dtype, scale=0.3, shift=1.0))


CASES = (
    case_grid("train", "check", [dict(rows=512, d=512), dict(rows=1100, d=320)], _DTYPES)
    # Held-out shapes differ in kind: unaligned d with a ragged last row block, a single row.
    + case_grid("heldout", "check", [dict(b=3, s=100, d=1000), dict(b=1, s=1, d=384)], _DTYPES)
    + case_grid("train", "bench", [dict(rows=16384, d=4096)], _DTYPES)
    + case_grid("heldout", "bench", [dict(b=8, s=1000, d=3000)], _DTYPES)
)

TASK = Task(
    name="residual_rmsnorm",
    version=2,
    level=2,
    description=("Fused residual add + RMS norm: s = x + residual, returns (rms_norm(s) * scale, "
                 "s) with eps=1e-6, computed in float32; outputs in x.dtype."),
    signature="kernel(x[..., d], residual[..., d], scale[d]) -> (out[..., d], sum[..., d])",
    reference=reference,
    arg_specs=arg_specs,
    make_inputs=make_inputs,
    out_specs=out_specs,
    cases=tuple(CASES),
    solution_path=Path(__file__).with_name("solution.py"),
    stresses=(small_scale(make_inputs, which=(0, 1)),),
)
