"""RoPE as two pallas_calls: a cos/sin table kernel, then a 4-D rotation kernel on half slices.

1. table kernel, grid (position blocks,): writes cos and sin of position * inv_freq as two
   [S, D/2] float32 tables (one column per frequency, not repeated over the two halves); the
   position and frequency come from iota inside the kernel.
2. rotate kernel, grid (batch, position blocks), both "parallel": q and k keep their
   [B, S, H, D] layout, a block is [bs, H, D] (H and D whole), the tables' block is [bs, D/2].
   rotate-half is never materialised: the two halves of each head are read as separate
   slices x1 = x[..., :D/2], x2 = x[..., D/2:] and the output halves are written separately,
       out[..., :D/2] = x1 * cos - x2 * sin,   out[..., D/2:] = x2 * cos + x1 * sin.
   Every head of a position shares the table row (broadcast over the H axis).

Ragged edges: the position axis uses cdiv grids; the last block's extra rows read padding and
are never written back (tables and outputs alike). H and D are whole-dim blocks, so no padding.
"""
import functools
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

BASE = 10000.0
BLOCK_S = 256           # positions per block of the rotation kernel (cap)
TABLE_BLOCK_S = 1024    # positions per block of the table kernel
_BLOCK_BYTES = 2 << 20  # one [bs, H, D] block, at most (f32 padded layout estimate)
VMEM_LIMIT_BYTES = 48 << 20


def table_kernel(cos_ref, sin_ref, *, head_dim):
    bs, half = cos_ref.shape
    pos = pl.program_id(0) * bs + lax.broadcasted_iota(jnp.int32, (bs, half), 0)
    i = lax.broadcasted_iota(jnp.int32, (bs, half), 1).astype(jnp.float32)
    inv_freq = jnp.exp(i * (-2.0 * math.log(BASE) / head_dim))
    angle = pos.astype(jnp.float32) * inv_freq
    cos_ref[...] = jnp.cos(angle)
    sin_ref[...] = jnp.sin(angle)


def rotate_kernel(cos_ref, sin_ref, q_ref, k_ref, qo_ref, ko_ref):
    half = cos_ref.shape[1]
    cos = cos_ref[...][:, None, :]     # [bs, 1, D/2], shared by every head
    sin = sin_ref[...][:, None, :]
    for x_ref, o_ref in ((q_ref, qo_ref), (k_ref, ko_ref)):
        x1 = x_ref[:, :, :half].astype(jnp.float32)
        x2 = x_ref[:, :, half:].astype(jnp.float32)
        o_ref[:, :, :half] = (x1 * cos - x2 * sin).astype(o_ref.dtype)
        o_ref[:, :, half:] = (x2 * cos + x1 * sin).astype(o_ref.dtype)


@functools.partial(jax.jit, static_argnames=("bs",))
def _rope(q, k, *, bs):
    b, s, h, d = q.shape
    half = d // 2
    tbs = s if s <= TABLE_BLOCK_S else TABLE_BLOCK_S
    table_spec = pl.BlockSpec((tbs, half), lambda i: (i, 0))
    table_shape = jax.ShapeDtypeStruct((s, half), jnp.float32)
    cos, sin = pl.pallas_call(
        functools.partial(table_kernel, head_dim=d),
        grid=(pl.cdiv(s, tbs),),
        out_specs=[table_spec, table_spec],
        out_shape=[table_shape, table_shape],
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel",)),
    )()

    tspec = pl.BlockSpec((bs, half), lambda bi, si: (si, 0))
    xspec = pl.BlockSpec((pl.squeezed, bs, h, d), lambda bi, si: (bi, si, 0, 0))
    shape = jax.ShapeDtypeStruct(q.shape, q.dtype)
    return pl.pallas_call(
        rotate_kernel,
        grid=(b, pl.cdiv(s, bs)),
        in_specs=[tspec, tspec, xspec, xspec],
        out_specs=[xspec, xspec],
        out_shape=[shape, shape],
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel"),
                                             vmem_limit_bytes=VMEM_LIMIT_BYTES),
    )(cos, sin, q, k)


def _round_up(x, m):
    return (x + m - 1) // m * m


def kernel(q, k):
    if q.ndim != 4 or k.shape != q.shape or q.shape[-1] % 2:
        raise ValueError(f"expected q, k of one shape [B, S, H, D] with even D, "
                         f"got {q.shape=} {k.shape=}")
    b, s, h, d = q.shape
    # VMEM tiles of a [bs, H, D] block are (8, 128)-padded on the (H, D) dims, in f32 terms.
    row_bytes = _round_up(h, 8) * _round_up(d, 128) * 4
    cap = min(BLOCK_S, max(8, _BLOCK_BYTES // row_bytes // 8 * 8))
    return _rope(q, k, bs=s if s <= cap else cap)
