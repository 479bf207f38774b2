"""layer_norm_bwd: gradients of y = layer_norm(x) * gamma + beta with respect to x[rows, d],
gamma[d] and beta[d].

Forward (as tasks/layer_norm, biased variance, eps=1e-5): mu = mean(x, -1),
rstd = rsqrt(mean((x - mu)^2, -1) + eps), xhat = (x - mu) * rstd, y = xhat * gamma + beta.
Given dy = dL/dy, in float32:

    g      = dy * gamma
    dx     = rstd * (g - mean(g, -1) - xhat * mean(g * xhat, -1))  # mu's and rstd's gradients
    dgamma = sum over rows of dy * xhat
    dbeta  = sum over rows of dy

dx in x.dtype, dgamma and dbeta in gamma.dtype. Both parameter gradients sum over every row, so
a kernel carries them across row blocks (a sequential grid axis and float32 VMEM accumulators)
or reduces partial sums.

Shapes from real models, each over 8192 tokens (4 sequences of the 2048-token context these
models were trained with), the LayerNorms before attention and the MLP: the train bench is
Phi-2's hidden size 2560 and GPT-J-6B's 4096; the held-out bench is Falcon-7B's 4544 (no
multiple of 128: every row's last lane tile is ragged) over 4000 tokens, a row count that is no
multiple of a row block. The aligned train check width is GPT-2 small's 768.
Shapes from: Phi-2, GPT-J-6B, Falcon-7B, GPT-2.
"""
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from tasks.layer_norm.task import make_inputs as layer_norm_inputs
from tasks.spec import ArgSpec, Case, Task, case_grid, normal
from tasks.stresses import large_offset, small_scale

_DTYPES = ("float32", "bfloat16")
EPS = 1e-5


def reference(x, gamma, dy):
    # The closed form of jax.vjp(lambda x, g, b: layer_norm(x) * g + b, x, gamma, beta)(dy),
    # in float32 (beta does not enter any gradient).
    xf, gf, dyf = (a.astype(jnp.float32) for a in (x, gamma, dy))
    mu = jnp.mean(xf, axis=-1, keepdims=True)                       # [rows, 1]
    centred = xf - mu
    rstd = jax.lax.rsqrt(jnp.mean(centred * centred, axis=-1, keepdims=True) + EPS)
    xhat = centred * rstd
    g = dyf * gf
    dx = rstd * (g - jnp.mean(g, axis=-1, keepdims=True)
                 - xhat * jnp.mean(g * xhat, axis=-1, keepdims=True))
    dgamma = jnp.sum(dyf * xhat, axis=0)
    dbeta = jnp.sum(dyf, axis=0)
    return dx.astype(x.dtype), dgamma.astype(gamma.dtype), dbeta.astype(gamma.dtype)


def arg_specs(case: Case) -> list[ArgSpec]:
    rows, d = case.dims["rows"], case.dims["d"]
    return [ArgSpec((rows, d), case.dtype), ArgSpec((d,), case.dtype), ArgSpec((rows, d), case.dtype)]


def out_specs(case: Case) -> list[ArgSpec]:
    rows, d = case.dims["rows"], case.dims["d"]
    return [ArgSpec((rows, d), case.dtype), ArgSpec((d,), case.dtype), ArgSpec((d,), case.dtype)]


def make_inputs(case: Case, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    rows, d = case.dims["rows"], case.dims["d"]
    # x and gamma as tasks/layer_norm draws them (rows with their own mean and spread, gamma far
    # from all-ones; its beta is not an input here); dy as the gradient of a loss averaged over
    # the rows, so dgamma and dbeta (sums over rows) are O(1) whatever the row count.
    x, gamma, _ = layer_norm_inputs(case, rng)
    return x, gamma, normal(rng, (rows, d), case.dtype, scale=rows ** -0.5)


CASES = (
    # Both span several row blocks (dgamma and dbeta carry across grid steps); the first is
    # GPT-2 small's width, the second is off the (8, 128) tile in rows and lanes, with a ragged
    # last row block whose padding rows must not reach the sums.
    case_grid("train", "check", [dict(rows=1024, d=768), dict(rows=1092, d=448)], _DTYPES)
    # Held-out shapes differ in kind: unaligned d and a row count under one sublane tile, a
    # ragged last row block over an unaligned d, a single row (the sums are that row's terms).
    + case_grid("heldout", "check",
                [dict(rows=37, d=1000), dict(rows=600, d=200), dict(rows=1, d=1024)], _DTYPES)
    # Phi-2 (hidden 2560) and GPT-J-6B (hidden 4096), 8192 tokens each.
    + case_grid("train", "bench", [dict(rows=8192, d=2560), dict(rows=8192, d=4096)], _DTYPES)
    # Falcon-7B: hidden 4544, 4000 tokens.
    + case_grid("heldout", "bench", [dict(rows=4000, d=4544)], _DTYPES)
)

TASK = Task(
    name="layer_norm_bwd",
    version=1,
    level=2,
    description=("Backward of y = layer_norm(x) * gamma + beta (biased variance, eps=1e-5): dx, "
                 "dgamma and dbeta (sums over all rows) from dy, computed in float32; outputs in "
                 "the dtypes of x and gamma."),
    signature="kernel(x[rows, d], gamma[d], dy[rows, d]) -> (dx[rows, d], dgamma[d], dbeta[d])",
    reference=reference,
    arg_specs=arg_specs,
    make_inputs=make_inputs,
    out_specs=out_specs,
    cases=tuple(CASES),
    solution_path=Path(__file__).with_name("solution.py"),
    required_features=("vmem_scratch",),
    # Rows far from zero (a one-pass E[x^2] - E[x]^2 variance loses its digits there), and rows
    # of magnitude 1e-4..1e-2, where eps is a large part of the variance (a backward that drops
    # eps from rstd's gradient, or assumes mean(xhat^2) == 1, is off there).
    stresses=(large_offset(make_inputs, which=0), small_scale(make_inputs, which=(0,))),
)
