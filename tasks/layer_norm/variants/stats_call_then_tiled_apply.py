"""Layer norm as two pallas_calls: a per-row statistics kernel, then a 2-D tiled apply kernel.

1. stats, grid (row blocks, "parallel"), whole rows per block: for SUB_ROWS rows at a time
   (a lax.fori_loop inside the step) the exact two-pass mean and centred variance are computed
   in float32 and written as two [rows, 1] f32 arrays: mean and rstd = rsqrt(var + eps).
   Nothing of the [rows, d] size is written.
2. apply, a 2-D "parallel" grid of [BLOCK_ROWS, BLOCK_D] tiles: out = (x - mean) * rstd *
   gamma + beta, where the tile only needs its rows' (mean, rstd) blocks and its columns'
   gamma/beta chunks. Tiles are independent, so this call has many small parallel steps and
   never needs a whole row in VMEM.
x is read twice (once per call) and two [rows] f32 vectors make a round trip through HBM.

Ragged edges: in the stats call a ragged last row block computes on rows that are never
written back; fewer rows than SUB_ROWS make one full-array block and one pass. In the apply
call out-of-range rows/columns of ragged tiles compute on padding and are never written back,
so no masks are needed anywhere.
"""
import functools
import math

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

EPS = 1e-5
SUB_ROWS = 32
STATS_ROWS = 512
_STATS_BLOCK_BYTES = 4 << 20
BLOCK_ROWS = 256
BLOCK_D = 1024
VMEM_LIMIT_BYTES = 32 << 20


def stats_kernel(x_ref, mean_ref, rstd_ref, *, sub):
    inv_d = 1.0 / x_ref.shape[1]

    def rows(r, carry):
        r0 = pl.multiple_of(r * sub, sub)
        x = x_ref[pl.ds(r0, sub), :].astype(jnp.float32)            # [sub, d]
        mean = jnp.sum(x, axis=1, keepdims=True) * inv_d
        c = x - mean
        var = jnp.sum(c * c, axis=1, keepdims=True) * inv_d
        mean_ref[pl.ds(r0, sub), :] = mean
        rstd_ref[pl.ds(r0, sub), :] = jax.lax.rsqrt(var + EPS)
        return carry

    jax.lax.fori_loop(0, x_ref.shape[0] // sub, rows, 0)


def apply_kernel(x_ref, mean_ref, rstd_ref, gamma_ref, beta_ref, o_ref):
    y = (x_ref[...].astype(jnp.float32) - mean_ref[...]) * rstd_ref[...]
    o_ref[...] = (y * gamma_ref[...].astype(jnp.float32)
                  + beta_ref[...].astype(jnp.float32)).astype(o_ref.dtype)


def _block(n, cap, align):
    cap = max(align, cap // align * align)
    return n if n <= cap else cap


@functools.partial(jax.jit, static_argnames=("sbr", "sub", "br", "bd"))
def _layer_norm_2d(x, gamma, beta, *, sbr, sub, br, bd):
    rows, d = x.shape
    col = pl.BlockSpec((sbr, 1), lambda i: (i, 0))
    mean, rstd = pl.pallas_call(
        functools.partial(stats_kernel, sub=sub),
        grid=(pl.cdiv(rows, sbr),),
        in_specs=[pl.BlockSpec((sbr, d), lambda i: (i, 0))],
        out_specs=[col, col],
        out_shape=[jax.ShapeDtypeStruct((rows, 1), jnp.float32)] * 2,
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel",),
                                             vmem_limit_bytes=VMEM_LIMIT_BYTES),
    )(x)
    tile = pl.BlockSpec((br, bd), lambda i, k: (i, k))
    row_vec = pl.BlockSpec((br, 1), lambda i, k: (i, 0))
    col_vec = pl.BlockSpec((1, bd), lambda i, k: (0, k))
    return pl.pallas_call(
        apply_kernel,
        grid=(pl.cdiv(rows, br), pl.cdiv(d, bd)),
        in_specs=[tile, row_vec, row_vec, col_vec, col_vec],
        out_specs=tile,
        out_shape=jax.ShapeDtypeStruct((rows, d), x.dtype),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel"),
                                             vmem_limit_bytes=VMEM_LIMIT_BYTES),
    )(x, mean, rstd, gamma.reshape(1, d), beta.reshape(1, d))


def kernel(x, gamma, beta):
    d = x.shape[-1]
    if gamma.shape != (d,) or beta.shape != (d,):
        raise ValueError(f"gamma and beta must have shape ({d},): {gamma.shape=} {beta.shape=}")
    rows = math.prod(x.shape[:-1])
    itemsize = jnp.dtype(x.dtype).itemsize
    sublane = 8 * max(1, 4 // itemsize)                     # 8 rows for f32, 16 for bf16
    if rows <= SUB_ROWS:
        sbr, sub = rows, rows
    else:
        cap = min(STATS_ROWS, _STATS_BLOCK_BYTES // (itemsize * d)) // SUB_ROWS * SUB_ROWS
        sbr, sub = min(max(SUB_ROWS, cap), rows // SUB_ROWS * SUB_ROWS), SUB_ROWS
    out = _layer_norm_2d(x.reshape(rows, d), gamma, beta, sbr=sbr, sub=sub,
                         br=_block(rows, BLOCK_ROWS, sublane), bd=_block(d, BLOCK_D, 128))
    return out.reshape(x.shape)
