"""Row-tiled layer norm: each grid step normalises a [block_rows, d] slab of whole rows in f32.

Two passes over the slab while it sits in VMEM: the row mean first, then the variance of the
centred values (no E[x^2] - E[x]^2 cancellation). gamma and beta are [1, d] blocks with a
constant index, so they are fetched once. The single row axis is "parallel"; a ragged last
row block computes on padding rows that are never written back.

Blocks are large (up to BLOCK_ROWS rows and _BLOCK_BYTES per input block, in the input dtype)
because at bench sizes the fixed cost per grid step, not bandwidth, is what small blocks lose:
bf16 [512, 4096] blocks give 32 steps over 16384 rows. The double-buffered blocks plus the f32
temporaries of the slab need more than the default scoped VMEM, so the limit is raised to
VMEM_LIMIT_BYTES.
"""
import functools
import math

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

EPS = 1e-5
BLOCK_ROWS = 512
_BLOCK_BYTES = 4 << 20              # one input row block, in the input dtype, at most
VMEM_LIMIT_BYTES = 64 << 20


def layer_norm_kernel(x_ref, gamma_ref, beta_ref, o_ref):
    x = x_ref[...].astype(jnp.float32)                         # [br, d]
    mean = jnp.mean(x, axis=-1, keepdims=True)                 # [br, 1]
    centred = x - mean
    var = jnp.mean(centred * centred, axis=-1, keepdims=True)  # [br, 1]
    y = centred * jax.lax.rsqrt(var + EPS)
    gamma = gamma_ref[...].astype(jnp.float32)                 # [1, d]
    beta = beta_ref[...].astype(jnp.float32)                   # [1, d]
    o_ref[...] = (y * gamma + beta).astype(o_ref.dtype)


def _rows_per_block(rows, d, dtype):
    sublane = 8 * max(1, 4 // jnp.dtype(dtype).itemsize)  # 8 rows for f32, 16 for bf16
    cap = min(BLOCK_ROWS, _BLOCK_BYTES // (jnp.dtype(dtype).itemsize * d))
    cap = max(sublane, cap // sublane * sublane)
    return rows if rows <= cap else cap


@functools.partial(jax.jit, static_argnames=("br",))
def _layer_norm_rows(x, gamma, beta, *, br):
    rows, d = x.shape
    row_spec = pl.BlockSpec((br, d), lambda i: (i, 0))
    vec_spec = pl.BlockSpec((1, d), lambda i: (0, 0))
    return pl.pallas_call(
        layer_norm_kernel,
        grid=(pl.cdiv(rows, br),),
        in_specs=[row_spec, vec_spec, vec_spec],
        out_specs=row_spec,
        out_shape=jax.ShapeDtypeStruct((rows, d), x.dtype),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel",),
                                             vmem_limit_bytes=VMEM_LIMIT_BYTES),
    )(x, gamma.reshape(1, d), beta.reshape(1, d))


def kernel(x, gamma, beta):
    d = x.shape[-1]
    if gamma.shape != (d,) or beta.shape != (d,):
        raise ValueError(f"gamma and beta must have shape ({d},): {gamma.shape=} {beta.shape=}")
    rows = math.prod(x.shape[:-1])
    out = _layer_norm_rows(x.reshape(rows, d), gamma, beta, br=_rows_per_block(rows, d, x.dtype))
    return out.reshape(x.shape)
