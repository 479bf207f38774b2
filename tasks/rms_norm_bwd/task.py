"""rms_norm_bwd: gradients of y = rms_norm(x) * scale with respect to x[rows, d] and scale[d].

Forward (as tasks/rms_norm, eps=1e-6): r = rsqrt(mean(x^2, -1) + eps), xhat = x * r,
y = xhat * scale. Given dy = dL/dy, in float32:

    g      = dy * scale
    dx     = r * (g - xhat * mean(g * xhat, -1))   # the second term is r's own gradient
    dscale = sum over rows of dy * xhat

dx in x.dtype, dscale in scale.dtype. dscale sums over every row, so a kernel either carries it
across row blocks (a sequential grid axis and a float32 VMEM accumulator) or reduces partial sums.

Shapes from real models: the train bench is Llama-3-8B's hidden size 4096 over one 8192-token
training sequence (its context length), the norm before attention and before the MLP; the
held-out bench is Qwen2-7B's hidden size 3584 (28 x 128) over 5000 tokens, a row count that is
no multiple of a row block.
Shapes from: Llama-3-8B, Qwen2-7B.
"""
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from tasks.spec import ArgSpec, Case, Task, case_grid, normal
from tasks.stresses import small_scale

_DTYPES = ("float32", "bfloat16")
EPS = 1e-6


def reference(x, scale, dy):
    # The closed form of jax.vjp(lambda x, s: rms_norm(x) * s, x, scale)(dy), in float32.
    xf, sf, dyf = (a.astype(jnp.float32) for a in (x, scale, dy))
    r = jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + EPS)  # [rows, 1]
    xhat = xf * r
    g = dyf * sf
    dx = r * (g - xhat * jnp.mean(g * xhat, axis=-1, keepdims=True))
    dscale = jnp.sum(dyf * xhat, axis=0)
    return dx.astype(x.dtype), dscale.astype(scale.dtype)


def arg_specs(case: Case) -> list[ArgSpec]:
    rows, d = case.dims["rows"], case.dims["d"]
    return [ArgSpec((rows, d), case.dtype), ArgSpec((d,), case.dtype), ArgSpec((rows, d), case.dtype)]


def out_specs(case: Case) -> list[ArgSpec]:
    rows, d = case.dims["rows"], case.dims["d"]
    return [ArgSpec((rows, d), case.dtype), ArgSpec((d,), case.dtype)]


def make_inputs(case: Case, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    rows, d = case.dims["rows"], case.dims["d"]
    # x and scale as tasks/rms_norm draws them (a non-zero mean, a scale far from all-ones);
    # dy as the gradient of a loss averaged over the rows, so dscale (a sum over rows) is O(1)
    # whatever the row count, and dx is O(rows**-0.5).
    return (normal(rng, (rows, d), case.dtype, scale=2.0, shift=0.3),
            normal(rng, (d,), case.dtype, scale=0.3, shift=1.0),
            normal(rng, (rows, d), case.dtype, scale=rows ** -0.5))


CASES = (
    # Both span several row blocks (dscale carries across grid steps); the second is off the
    # (8, 128) tile in rows and lanes, with a ragged last row block whose padding rows must not
    # reach dscale.
    case_grid("train", "check", [dict(rows=1024, d=512), dict(rows=1100, d=448)], _DTYPES)
    # Held-out shapes differ in kind: unaligned d and a row count under one sublane tile, a
    # ragged last row block over an unaligned d, a single row (dscale is that row's product).
    + case_grid("heldout", "check",
                [dict(rows=37, d=1000), dict(rows=700, d=200), dict(rows=1, d=768)], _DTYPES)
    # Llama-3-8B: hidden 4096, one 8192-token sequence.
    + case_grid("train", "bench", [dict(rows=8192, d=4096)], _DTYPES)
    # Qwen2-7B: hidden 3584, 5000 tokens.
    + case_grid("heldout", "bench", [dict(rows=5000, d=3584)], _DTYPES)
)

TASK = Task(
    name="rms_norm_bwd",
    version=1,
    level=2,
    description=("Backward of y = rms_norm(x) * scale (eps=1e-6): dx and dscale (a sum over all "
                 "rows) from dy, computed in float32; outputs in the dtypes of x and scale."),
    signature="kernel(x[rows, d], scale[d], dy[rows, d]) -> (dx[rows, d], dscale[d])",
    reference=reference,
    arg_specs=arg_specs,
    make_inputs=make_inputs,
    out_specs=out_specs,
    cases=tuple(CASES),
    solution_path=Path(__file__).with_name("solution.py"),
    required_features=("vmem_scratch",),
    # Rows of magnitude 1e-4..1e-2, where eps is a large part of the mean square: a backward
    # that assumes r**2 * mean(x^2) == 1 (eps dropped from r's gradient) is off there.
    stresses=(small_scale(make_inputs, which=(0,)),),
)
