"""Residual add + RMS norm as two pallas_calls over [BLOCK_ROWS, BLOCK_D] tiles.

1. sum + statistics, grid (row blocks "parallel", column chunks "arbitrary"): each step forms
   s = x + residual in float32 for one tile, writes it (cast to x.dtype) as the tile of the
   new residual stream, and adds the tile's row sums of s^2 into a float32 [rows, 1] output
   block that stays resident across the chunks (it is its own accumulator: seeded at the first
   chunk, updated in place after). At the last chunk the block is turned in place into
   inv_rms = rsqrt(sum / d + eps).
2. apply, a 2-D "parallel" grid of tiles: recomputes s = x + residual in float32 from the
   inputs (not from the rounded stored sum, so the normalised output matches an all-f32
   computation) and writes s * inv_rms * scale.
Neither call keeps a whole row in VMEM, so any d fits; x and residual are read twice and a
[rows] f32 vector makes a round trip through HBM.

Ragged edges: in call 1, lanes past d of a ragged last chunk hold undefined data: they are
masked out of the sum of squares with a column iota (and their sum columns are never written
back). Out-of-range rows of ragged row blocks, and out-of-range tile elements in call 2,
compute on padding and are never written back.
"""
import functools
import math

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

EPS = 1e-6
BLOCK_ROWS = 256
BLOCK_D = 1024
VMEM_LIMIT_BYTES = 32 << 20


def sum_stats_kernel(x_ref, r_ref, sum_ref, inv_ref, *, d, bd):
    k = pl.program_id(1)
    s = x_ref[...].astype(jnp.float32) + r_ref[...].astype(jnp.float32)   # [br, bd]
    sum_ref[...] = s.astype(sum_ref.dtype)
    if d % bd:
        valid = k * bd + jax.lax.broadcasted_iota(jnp.int32, s.shape, 1) < d
        s = jnp.where(valid, s, 0.0)
    ss = jnp.sum(s * s, axis=1, keepdims=True)                             # [br, 1]

    @pl.when(k == 0)
    def _seed():
        inv_ref[...] = ss

    @pl.when(k > 0)
    def _add():
        inv_ref[...] += ss

    @pl.when(k == pl.num_programs(1) - 1)
    def _finish():
        inv_ref[...] = jax.lax.rsqrt(inv_ref[...] * (1.0 / d) + EPS)


def apply_kernel(x_ref, r_ref, inv_ref, scale_ref, o_ref):
    s = x_ref[...].astype(jnp.float32) + r_ref[...].astype(jnp.float32)
    o_ref[...] = (s * inv_ref[...] * scale_ref[...].astype(jnp.float32)).astype(o_ref.dtype)


def _block(n, cap, align):
    """cap rounded down to the alignment, or the full dim when that is smaller (always legal)."""
    cap = max(align, cap // align * align)
    return n if n <= cap else cap


@functools.partial(jax.jit, static_argnames=("br", "bd"))
def _residual_rmsnorm_2d(x, r, scale, *, br, bd):
    rows, d = x.shape
    grid = (pl.cdiv(rows, br), pl.cdiv(d, bd))
    tile = pl.BlockSpec((br, bd), lambda i, k: (i, k))
    row_vec = pl.BlockSpec((br, 1), lambda i, k: (i, 0))
    total, inv_rms = pl.pallas_call(
        functools.partial(sum_stats_kernel, d=d, bd=bd),
        grid=grid,
        in_specs=[tile, tile],
        out_specs=[tile, row_vec],
        out_shape=[jax.ShapeDtypeStruct((rows, d), x.dtype),
                   jax.ShapeDtypeStruct((rows, 1), jnp.float32)],
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary"),
                                             vmem_limit_bytes=VMEM_LIMIT_BYTES),
    )(x, r)
    out = pl.pallas_call(
        apply_kernel,
        grid=grid,
        in_specs=[tile, tile, row_vec, pl.BlockSpec((1, bd), lambda i, k: (0, k))],
        out_specs=tile,
        out_shape=jax.ShapeDtypeStruct((rows, d), x.dtype),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel"),
                                             vmem_limit_bytes=VMEM_LIMIT_BYTES),
    )(x, r, inv_rms, scale.reshape(1, d))
    return out, total


def kernel(x, residual, scale):
    d = x.shape[-1]
    if residual.shape != x.shape or scale.shape != (d,):
        raise ValueError(f"shape mismatch: {x.shape=} {residual.shape=} {scale.shape=}")
    rows = math.prod(x.shape[:-1])
    sublane = 8 * max(1, 4 // jnp.dtype(x.dtype).itemsize)  # 8 rows for f32, 16 for bf16
    out, total = _residual_rmsnorm_2d(x.reshape(rows, d), residual.reshape(rows, d), scale,
                                      br=_block(rows, BLOCK_ROWS, sublane),
                                      bd=_block(d, BLOCK_D, 128))
    return out.reshape(x.shape), total.reshape(x.shape)
