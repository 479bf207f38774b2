"""Row-tiled LayerNorm backward: dx per row block, dgamma and dbeta accumulated across blocks.

Grid: one "arbitrary" (sequential) axis over row blocks of whole rows. Each step reads a
[block_rows, d] slab of x and of dy, recomputes the row mean, rstd (two passes over the slab:
the variance of the centred values, no E[x^2] - E[x]^2) and xhat for it, writes
dx = rstd * (g - mean(g) - xhat * mean(g * xhat)) with g = dy * gamma, and adds the slab's
column sums of dy * xhat and of dy to a [2, d] float32 VMEM accumulator (row 0 dgamma, row 1
dbeta). The dgamma and dbeta output blocks have the same index at every step, so they stay
resident and are written once, at the last step, from the accumulator (cast to gamma's dtype
only there). x and dy are read once, dx written once; gamma is a [1, d] block with a constant
index (fetched once).

A row count that is not a multiple of the block leaves a ragged last block: its padding rows
hold whatever the buffer held, so they are masked out of both sums (their dx rows are never
written back). Blocks hold up to BLOCK_ROWS rows and _F32_BLOCK_BYTES of float32 slab; the
double-buffered blocks plus the float32 temporaries need more than the default scoped VMEM,
so the limit is raised to VMEM_LIMIT_BYTES.
"""
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

EPS = 1e-5
BLOCK_ROWS = 256  # tune: 64, 128, 256, 512  (rows per block, at most; a multiple of 16)
_F32_BLOCK_BYTES = 4 << 20          # one row block as float32, at most
VMEM_LIMIT_BYTES = 64 << 20


def layer_norm_bwd_kernel(x_ref, gamma_ref, dy_ref, dx_ref, dgamma_ref, dbeta_ref, acc_ref, *,
                          rows, block_rows):
    i = pl.program_id(0)

    @pl.when(i == 0)
    def _init():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    x = x_ref[...].astype(jnp.float32)                               # [br, d]
    dy = dy_ref[...].astype(jnp.float32)                             # [br, d]
    gamma = gamma_ref[...].astype(jnp.float32)                       # [1, d]
    mu = jnp.mean(x, axis=-1, keepdims=True)                         # [br, 1]
    centred = x - mu
    rstd = jax.lax.rsqrt(jnp.mean(centred * centred, axis=-1, keepdims=True) + EPS)
    xhat = centred * rstd
    g = dy * gamma
    g_mean = jnp.mean(g, axis=-1, keepdims=True)                     # [br, 1]
    proj = jnp.mean(g * xhat, axis=-1, keepdims=True)                # [br, 1]
    dx_ref[...] = (rstd * (g - g_mean - xhat * proj)).astype(dx_ref.dtype)

    dg = dy * xhat                                                   # [br, d]
    db = dy
    if rows % block_rows:  # static: only a ragged last block has padding rows to leave out
        row = i * block_rows + jax.lax.broadcasted_iota(jnp.int32, dg.shape, 0)
        live = row < rows
        dg = jnp.where(live, dg, 0.0)
        db = jnp.where(live, db, 0.0)
    acc_ref[0:1, :] += jnp.sum(dg, axis=0, keepdims=True)            # [1, d]
    acc_ref[1:2, :] += jnp.sum(db, axis=0, keepdims=True)

    @pl.when(i == pl.num_programs(0) - 1)
    def _store():
        dgamma_ref[...] = acc_ref[0:1, :].astype(dgamma_ref.dtype)
        dbeta_ref[...] = acc_ref[1:2, :].astype(dbeta_ref.dtype)


def _block_rows(rows, d, dtype):
    sublane = 8 * max(1, 4 // jnp.dtype(dtype).itemsize)  # 8 rows for f32, 16 for bf16
    cap = min(BLOCK_ROWS, _F32_BLOCK_BYTES // (4 * d)) // sublane * sublane
    cap = max(sublane, cap)
    # The full row count is always a legal block; otherwise a multiple of the sublane tile.
    return rows if rows <= cap else cap


@functools.partial(jax.jit, static_argnames=("br",))
def _layer_norm_bwd(x, gamma, dy, *, br):
    rows, d = x.shape
    row_block = pl.BlockSpec((br, d), lambda i: (i, 0))
    fixed = pl.BlockSpec((1, d), lambda i: (0, 0))  # same block every step
    dx, dgamma, dbeta = pl.pallas_call(
        functools.partial(layer_norm_bwd_kernel, rows=rows, block_rows=br),
        grid=(pl.cdiv(rows, br),),
        in_specs=[row_block, fixed, row_block],
        out_specs=[row_block, fixed, fixed],
        out_shape=[jax.ShapeDtypeStruct((rows, d), x.dtype),
                   jax.ShapeDtypeStruct((1, d), gamma.dtype),
                   jax.ShapeDtypeStruct((1, d), gamma.dtype)],
        scratch_shapes=[pltpu.VMEM((2, d), jnp.float32)],  # dgamma, dbeta partial sums
        # The sums accumulate across the row blocks: the axis must run in order on one core.
        compiler_params=pltpu.CompilerParams(dimension_semantics=("arbitrary",),
                                             vmem_limit_bytes=VMEM_LIMIT_BYTES),
    )(x, gamma.reshape(1, d), dy)
    return dx, dgamma.reshape(d), dbeta.reshape(d)


def kernel(x, gamma, dy):
    if x.ndim != 2 or dy.shape != x.shape or gamma.shape != (x.shape[1],):
        raise ValueError(f"expected x[rows, d], gamma[d], dy[rows, d]; got {x.shape=}, "
                         f"{gamma.shape=}, {dy.shape=}")
    rows, d = x.shape
    return _layer_norm_bwd(x, gamma, dy, br=_block_rows(rows, d, x.dtype))
