"""Fused residual add + RMS norm, with an in-kernel loop over row sub-tiles.

Grid: one "parallel" axis over large row blocks (up to BLOCK_ROWS rows), so the per-step
overhead is paid rarely. Inside a block, a fori_loop walks SUB_ROWS rows at a time: it forms
s = x + residual in float32 for just those rows, stores s, and normalises it with
rsqrt(mean(s^2) + eps) * scale. Only [SUB_ROWS, d] float32 temporaries are live at once, so
VMEM holds little beyond the double-buffered blocks themselves (unlike a kernel that
materialises the f32 sum of the whole slab).

Ragged rows: a ragged last block's out-of-range sub-tiles compute on padding that is never
written back; fewer rows than one sub-tile make a single full-array block and one pass.
"""
import functools
import math

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

EPS = 1e-6
BLOCK_ROWS = 1024
SUB_ROWS = 32
_BLOCK_BYTES = 4 << 20              # one row block, in the input dtype, at most
VMEM_LIMIT_BYTES = 64 << 20


def residual_rmsnorm_kernel(x_ref, r_ref, scale_ref, o_ref, sum_ref, *, sub):
    scale = scale_ref[...].astype(jnp.float32)                          # [1, d]
    inv_d = 1.0 / x_ref.shape[1]

    def body(t, carry):
        r0 = pl.multiple_of(t * sub, sub)
        rows = pl.ds(r0, sub)
        s = x_ref[rows, :].astype(jnp.float32) + r_ref[rows, :].astype(jnp.float32)
        sum_ref[rows, :] = s.astype(sum_ref.dtype)
        inv_rms = jax.lax.rsqrt(jnp.sum(s * s, axis=1, keepdims=True) * inv_d + EPS)
        o_ref[rows, :] = (s * inv_rms * scale).astype(o_ref.dtype)
        return carry

    jax.lax.fori_loop(0, x_ref.shape[0] // sub, body, 0)


@functools.partial(jax.jit, static_argnames=("br", "sub"))
def _residual_rmsnorm_2d(x, r, scale, *, br, sub):
    rows, d = x.shape
    row_spec = pl.BlockSpec((br, d), lambda i: (i, 0))
    shape = jax.ShapeDtypeStruct((rows, d), x.dtype)
    return pl.pallas_call(
        functools.partial(residual_rmsnorm_kernel, sub=sub),
        grid=(pl.cdiv(rows, br),),
        in_specs=[row_spec, row_spec, pl.BlockSpec((1, d), lambda i: (0, 0))],
        out_specs=[row_spec, row_spec],
        out_shape=[shape, shape],
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel",),
                                             vmem_limit_bytes=VMEM_LIMIT_BYTES),
    )(x, r, scale.reshape(1, d))


def _blocks(rows, d, dtype):
    """(block rows, rows per loop pass); the block is a multiple of the pass. Four arrays
    are double-buffered at block size, so the block is also capped at _BLOCK_BYTES."""
    itemsize = jnp.dtype(dtype).itemsize
    sublane = 8 * max(1, 4 // itemsize)                     # 8 rows for f32, 16 for bf16
    sub = max(sublane, SUB_ROWS // sublane * sublane)
    if rows <= sub:
        return rows, rows                   # one full-array block, one pass
    br = max(sub, min(BLOCK_ROWS, _BLOCK_BYTES // (itemsize * d)) // sub * sub)
    return min(br, rows // sub * sub), sub  # never a block taller than the array


def kernel(x, residual, scale):
    d = x.shape[-1]
    if residual.shape != x.shape or scale.shape != (d,):
        raise ValueError(f"shape mismatch: {x.shape=} {residual.shape=} {scale.shape=}")
    rows = math.prod(x.shape[:-1])
    br, sub = _blocks(rows, d, x.dtype)
    out, total = _residual_rmsnorm_2d(x.reshape(rows, d), residual.reshape(rows, d), scale,
                                      br=br, sub=sub)
    return out.reshape(x.shape), total.reshape(x.shape)
