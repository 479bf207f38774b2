"""Row-tiled RMS-norm backward: dx per row block, dscale accumulated across the row blocks.

Grid: one "arbitrary" (sequential) axis over row blocks of whole rows. Each step reads a
[block_rows, d] slab of x and of dy, recomputes r = rsqrt(mean(x^2) + eps) and xhat = x * r for
it, writes dx = r * (g - xhat * mean(g * xhat)) with g = dy * scale, and adds the slab's column
sums of dy * xhat to a [1, d] float32 VMEM accumulator. The dscale output block has the same
index at every step, so it stays resident and is written once, at the last step, from the
accumulator (cast to scale's dtype only there). x and dy are read once, dx written once; scale
is a [1, d] block with a constant index (fetched once).

A row count that is not a multiple of the block leaves a ragged last block: its padding rows
hold whatever the buffer held, so their dy * xhat is masked out of dscale (their dx rows are
never written back). Blocks hold up to BLOCK_ROWS rows and _F32_BLOCK_BYTES of float32 slab:
at bench sizes the per-step cost, not bandwidth, is what small blocks lose, and the double-
buffered blocks plus the float32 temporaries need more than the default scoped VMEM, so the
limit is raised to VMEM_LIMIT_BYTES.
"""
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

EPS = 1e-6
BLOCK_ROWS = 256  # tune: 64, 128, 256, 512  (rows per block, at most; a multiple of 16)
_F32_BLOCK_BYTES = 4 << 20          # one row block as float32, at most
VMEM_LIMIT_BYTES = 64 << 20


def rms_norm_bwd_kernel(x_ref, scale_ref, dy_ref, dx_ref, dscale_ref, acc_ref, *, rows, block_rows):
    i = pl.program_id(0)

    @pl.when(i == 0)
    def _init():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    x = x_ref[...].astype(jnp.float32)                            # [br, d]
    dy = dy_ref[...].astype(jnp.float32)                          # [br, d]
    scale = scale_ref[...].astype(jnp.float32)                    # [1, d]
    r = jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + EPS)  # [br, 1]
    xhat = x * r
    g = dy * scale
    proj = jnp.mean(g * xhat, axis=-1, keepdims=True)             # [br, 1]
    dx_ref[...] = (r * (g - xhat * proj)).astype(dx_ref.dtype)

    contrib = dy * xhat                                           # [br, d]
    if rows % block_rows:  # static: only a ragged last block has padding rows to leave out
        row = i * block_rows + jax.lax.broadcasted_iota(jnp.int32, contrib.shape, 0)
        contrib = jnp.where(row < rows, contrib, 0.0)
    acc_ref[...] += jnp.sum(contrib, axis=0, keepdims=True)       # [1, d]

    @pl.when(i == pl.num_programs(0) - 1)
    def _store():
        dscale_ref[...] = acc_ref[...].astype(dscale_ref.dtype)


def _block_rows(rows, d, dtype):
    sublane = 8 * max(1, 4 // jnp.dtype(dtype).itemsize)  # 8 rows for f32, 16 for bf16
    cap = min(BLOCK_ROWS, _F32_BLOCK_BYTES // (4 * d)) // sublane * sublane
    cap = max(sublane, cap)
    # The full row count is always a legal block; otherwise a multiple of the sublane tile.
    return rows if rows <= cap else cap


@functools.partial(jax.jit, static_argnames=("br",))
def _rms_norm_bwd(x, scale, dy, *, br):
    rows, d = x.shape
    row_block = pl.BlockSpec((br, d), lambda i: (i, 0))
    fixed = pl.BlockSpec((1, d), lambda i: (0, 0))  # same block every step
    dx, dscale = pl.pallas_call(
        functools.partial(rms_norm_bwd_kernel, rows=rows, block_rows=br),
        grid=(pl.cdiv(rows, br),),
        in_specs=[row_block, fixed, row_block],
        out_specs=[row_block, fixed],
        out_shape=[jax.ShapeDtypeStruct((rows, d), x.dtype),
                   jax.ShapeDtypeStruct((1, d), scale.dtype)],
        scratch_shapes=[pltpu.VMEM((1, d), jnp.float32)],
        # dscale accumulates across the row blocks: the axis must run in order on one core.
        compiler_params=pltpu.CompilerParams(dimension_semantics=("arbitrary",),
                                             vmem_limit_bytes=VMEM_LIMIT_BYTES),
    )(x, scale.reshape(1, d), dy)
    return dx, dscale.reshape(d)


def kernel(x, scale, dy):
    if x.ndim != 2 or dy.shape != x.shape or scale.shape != (x.shape[1],):
        raise ValueError(f"expected x[rows, d], scale[d], dy[rows, d]; got {x.shape=}, "
                         f"{scale.shape=}, {dy.shape=}")
    rows, d = x.shape
    return _rms_norm_bwd(x, scale, dy, br=_block_rows(rows, d, x.dtype))
