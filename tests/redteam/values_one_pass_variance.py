"""Layer norm with the variance taken in one pass, as E[x^2] - E[x]^2 over each row.

Cheat class: values the task's inputs never produce. With rows of mean |m| <= 2 the one-pass
variance keeps enough float32 digits to pass; with a mean of 100 times the spread (activations
after a residual add drift there) the cancellation loses them. Needs a stress regime.

task: layer_norm  expect: wrong_output
wrong at: stress=large_offset
"""
import functools
import math

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

EPS = 1e-5
BLOCK_ROWS = 256


def layer_norm_kernel(x_ref, gamma_ref, beta_ref, o_ref):
    x = x_ref[...].astype(jnp.float32)                   # [br, d]
    mean = jnp.mean(x, axis=-1, keepdims=True)           # [br, 1]
    mean_sq = jnp.mean(x * x, axis=-1, keepdims=True)    # [br, 1]
    var = jnp.maximum(mean_sq - mean * mean, 0.0)        # one pass: no second sweep over the row
    y = (x - mean) * jax.lax.rsqrt(var + EPS)
    o_ref[...] = (y * gamma_ref[...].astype(jnp.float32) + beta_ref[...].astype(jnp.float32)).astype(o_ref.dtype)


@functools.partial(jax.jit, static_argnames=("br",))
def _rows(x, gamma, beta, *, br):
    rows, d = x.shape
    return pl.pallas_call(
        layer_norm_kernel,
        grid=(pl.cdiv(rows, br),),
        in_specs=[pl.BlockSpec((br, d), lambda i: (i, 0)), pl.BlockSpec((1, d), lambda i: (0, 0)),
                  pl.BlockSpec((1, d), lambda i: (0, 0))],
        out_specs=pl.BlockSpec((br, d), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct((rows, d), x.dtype),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel",), vmem_limit_bytes=64 << 20),
    )(x, gamma.reshape(1, d), beta.reshape(1, d))


def kernel(x, gamma, beta):
    d = x.shape[-1]
    rows = math.prod(x.shape[:-1])
    br = rows if rows <= BLOCK_ROWS else BLOCK_ROWS
    return _rows(x.reshape(rows, d), gamma, beta, br=br).reshape(x.shape)
