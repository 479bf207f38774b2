"""layer_norm: (x - mean) * rsqrt(var + 1e-5) * gamma + beta over the last axis, in float32.

The train bench's d=4096 is GPT-J-6B's n_embd (the width of its LayerNorms).
Shapes from: GPT-J-6B.
"""
from pathlib import Path

import jax.numpy as jnp
import numpy as np

from tasks.spec import ArgSpec, Case, Task, activation_shape, case_grid, normal, np_dtype
from tasks.stresses import large_offset, small_scale

_DTYPES = ("float32", "bfloat16")
EPS = 1e-5


def reference(x, gamma, beta):
    xf = x.astype(jnp.float32)
    mean = jnp.mean(xf, axis=-1, keepdims=True)
    var = jnp.mean((xf - mean) ** 2, axis=-1, keepdims=True)
    y = (xf - mean) / jnp.sqrt(var + EPS)
    return (y * gamma.astype(jnp.float32) + beta.astype(jnp.float32)).astype(x.dtype)


def arg_specs(case: Case) -> list[ArgSpec]:
    d = case.dims["d"]
    return [ArgSpec(activation_shape(case), case.dtype), ArgSpec((d,), case.dtype),
            ArgSpec((d,), case.dtype)]


def out_specs(case: Case) -> list[ArgSpec]:
    return [ArgSpec(activation_shape(case), case.dtype)]


def make_inputs(case: Case, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    shape = activation_shape(case)
    d = case.dims["d"]
    # Rows with their own mean (uniform in [-2, 2]) and spread (std 0.5-3), so skipping the
    # mean, the variance or either affine term shows up; gamma far from ones, beta non-zero.
    spread = rng.uniform(0.5, 3.0, size=shape[:-1] + (1,)).astype(np.float32)
    shift = rng.uniform(-2.0, 2.0, size=shape[:-1] + (1,)).astype(np.float32)
    x = rng.standard_normal(shape, dtype=np.float32) * spread + shift
    return (x.astype(np_dtype(case.dtype)),
            normal(rng, (d,), case.dtype, scale=0.3, shift=1.0),
            normal(rng, (d,), case.dtype, scale=0.3))


CASES = (
    # 2-D [rows, d] and 3-D [b, s, d].
    case_grid("train", "check", [dict(rows=512, d=768), dict(b=2, s=276, d=448)], _DTYPES)
    # Held-out shapes differ in kind: unaligned d and row counts, a ragged last row block
    # (750 rows in blocks of 512), a single row.
    + case_grid("heldout", "check",
                [dict(rows=37, d=1000), dict(b=3, s=250, d=320), dict(b=1, s=1, d=1024)], _DTYPES)
    + case_grid("train", "bench", [dict(rows=16384, d=4096)], _DTYPES)
    + case_grid("heldout", "bench", [dict(b=6, s=1500, d=5000)], _DTYPES)
)

TASK = Task(
    name="layer_norm",
    version=2,
    level=1,
    description=("Layer normalisation over the last axis with learned gamma and beta, eps=1e-5, "
                 "computed in float32; output in the input dtype."),
    signature="kernel(x[..., d], gamma[d], beta[d]) -> [..., d]",
    reference=reference,
    arg_specs=arg_specs,
    make_inputs=make_inputs,
    out_specs=out_specs,
    cases=tuple(CASES),
    solution_path=Path(__file__).with_name("solution.py"),
    stresses=(large_offset(make_inputs), small_scale(make_inputs)),
)
