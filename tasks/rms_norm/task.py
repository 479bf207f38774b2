"""rms_norm: x[..., d] * rsqrt(mean(x^2, -1) + eps) * scale[d], computed in float32.

The train bench's d=4096 is Llama-2-7B's and Llama-3-8B's hidden_size (their RMSNorms).
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


def reference(x, scale):
    xf = x.astype(jnp.float32)
    ms = jnp.mean(xf * xf, axis=-1, keepdims=True)
    return (xf * jax.lax.rsqrt(ms + EPS) * scale.astype(jnp.float32)).astype(x.dtype)


def arg_specs(case: Case) -> list[ArgSpec]:
    return [ArgSpec(activation_shape(case), case.dtype), ArgSpec((case.dims["d"],), case.dtype)]


def out_specs(case: Case) -> list[ArgSpec]:
    return [ArgSpec(activation_shape(case), case.dtype)]


def make_inputs(case: Case, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    x_spec, s_spec = arg_specs(case)
    # A non-zero mean and spread, and a scale far from all-ones, so skipping the scale,
    # the normalisation or the mean's 1/d shows up.
    return (normal(rng, x_spec.shape, case.dtype, scale=2.0, shift=0.3),
            normal(rng, s_spec.shape, case.dtype, scale=0.3, shift=1.0))


CASES = (
    # 2-D [rows, d] and 3-D [b, s, d]; the first spans several row blocks.
    case_grid("train", "check", [dict(rows=1024, d=256), dict(b=2, s=276, d=576)], _DTYPES)
    # Held-out shapes differ in kind: unaligned d and row counts, a ragged last row block,
    # a single row.
    + case_grid("heldout", "check",
                [dict(rows=37, d=1000), dict(b=3, s=300, d=200), dict(b=1, s=1, d=384)], _DTYPES)
    + case_grid("train", "bench", [dict(rows=16384, d=4096)], _DTYPES)
    + case_grid("heldout", "bench", [dict(b=8, s=1000, d=3000)], _DTYPES)
)

TASK = Task(
    name="rms_norm",
    version=2,
    level=1,
    description=("RMS normalisation over the last axis with a learned scale, eps=1e-6, "
                 "computed in float32; output in the input dtype."),
    signature="kernel(x[..., d], scale[d]) -> [..., d]",
    reference=reference,
    arg_specs=arg_specs,
    make_inputs=make_inputs,
    out_specs=out_specs,
    cases=tuple(CASES),
    solution_path=Path(__file__).with_name("solution.py"),
    stresses=(small_scale(make_inputs, which=(0,)),),
)
