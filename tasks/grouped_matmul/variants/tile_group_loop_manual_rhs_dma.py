"""Grouped matmul: one grid step per output tile, looping over the tile's groups in the kernel.

Grid (M tiles, N tiles), both "parallel", plain BlockSpecs for the lhs row tile [bm, k] and the
output tile [bm, bn]. rhs stays in HBM (memory_space ANY). Scalar prefetch carries, per row
tile, the first and last group owning one of its rows (lo, hi), and every group's row range
[start, end). Inside the step a lax.fori_loop walks the groups lo..hi: the [k, bn] weight slab
of group gi is brought in by manual DMA, double-buffered (the next group's slab is in flight
while this one multiplies), the lhs rows outside [start, end) are zeroed, and the product is
added to an f32 [bm, bn] accumulator carried by the loop (no VMEM scratch accumulator, no
reduction grid axis). The carry is cast and stored once per step.

Ragged edges: the wrapper zero-pads m to the row block, k to a multiple of 128 (zero columns
add nothing) and n to the column block (every DMA'd slab stays in bounds); padded rows belong
to no group (a tile's group range stops at its last real row) and are sliced off with the
padded columns. Empty groups inside a tile's range are zeroed out by the row mask.
"""
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

BLOCK_M = 256
BLOCK_N = 512
_MiB = 1 << 20


def _round_up(x, m):
    return (x + m - 1) // m * m


def gmm_kernel(lo_ref, hi_ref, start_ref, end_ref, lhs_ref, rhs_hbm, o_ref, rhs_buf, sems):
    i, j = pl.program_id(0), pl.program_id(1)
    bm = lhs_ref.shape[0]
    bn = o_ref.shape[1]
    cols = pl.ds(pl.multiple_of(j * bn, bn), bn)
    lo, hi = lo_ref[i], hi_ref[i]

    def slab_copy(group, slot):
        return pltpu.make_async_copy(rhs_hbm.at[group, :, cols], rhs_buf.at[slot], sems.at[slot])

    slab_copy(lo, 0).start()
    row = i * bm + lax.broadcasted_iota(jnp.int32, (bm, 1), 0)

    def body(gi, acc):
        slot = lax.rem(gi - lo, 2)

        @pl.when(gi < hi)
        def _prefetch_next():
            slab_copy(gi + 1, 1 - slot).start()

        slab_copy(gi, slot).wait()
        lhs = lhs_ref[...]
        in_group = (row >= start_ref[gi]) & (row < end_ref[gi])
        lhs = jnp.where(in_group, lhs, jnp.zeros_like(lhs))
        return acc + jnp.dot(lhs, rhs_buf[slot], preferred_element_type=jnp.float32)

    acc = lax.fori_loop(lo, hi + 1, body, jnp.zeros((bm, bn), jnp.float32))
    o_ref[...] = acc.astype(o_ref.dtype)


@functools.partial(jax.jit, static_argnames=("bm", "bn"))
def _gmm(lhs, rhs, group_sizes, *, bm, bn):
    m, k = lhs.shape
    g, _, n = rhs.shape
    mp, kp, np_ = _round_up(m, bm), _round_up(k, 128), _round_up(n, bn)
    lhs_p = jnp.pad(lhs, ((0, mp - m), (0, kp - k)))
    rhs_p = jnp.pad(rhs, ((0, 0), (0, kp - k), (0, np_ - n)))

    # Scalar metadata (O(g + tiles)): group row ranges, and the groups of each tile's first
    # and last real row (the group of row r is the first group whose end exceeds r).
    sizes = group_sizes.astype(jnp.int32)
    ends = jnp.cumsum(sizes)
    starts = ends - sizes
    tile_first = jnp.arange(mp // bm, dtype=jnp.int32) * bm
    tile_last = jnp.minimum(tile_first + bm, m) - 1
    lo = jnp.minimum(jnp.searchsorted(ends, tile_first, side="right"), g - 1).astype(jnp.int32)
    hi = jnp.minimum(jnp.searchsorted(ends, tile_last, side="right"), g - 1).astype(jnp.int32)

    itemsize = lhs.dtype.itemsize
    need = (2 * (bm * kp + bm * bn) * itemsize + 2 * kp * bn * itemsize
            + 3 * bm * bn * 4 + bm * kp * 4)
    out = pl.pallas_call(
        gmm_kernel,
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=4,
            grid=(mp // bm, np_ // bn),
            in_specs=[pl.BlockSpec((bm, kp), lambda i, j, *_: (i, 0)),
                      pl.BlockSpec(memory_space=pl.ANY)],
            out_specs=pl.BlockSpec((bm, bn), lambda i, j, *_: (i, j)),
            scratch_shapes=[pltpu.VMEM((2, kp, bn), rhs.dtype),   # weight slabs, 2 slots
                            pltpu.SemaphoreType.DMA((2,))],
        ),
        out_shape=jax.ShapeDtypeStruct((mp, np_), lhs.dtype),
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel"),
            vmem_limit_bytes=int(min(100 * _MiB, max(32 * _MiB, need + need // 4)))),
    )(lo, hi, starts, ends, lhs_p, rhs_p)
    return out[:m, :n]


def kernel(lhs, rhs, group_sizes):
    m, k = lhs.shape
    g, k2, n = rhs.shape
    if k != k2 or group_sizes.shape != (g,):
        raise ValueError(f"shape mismatch: {lhs.shape=} {rhs.shape=} {group_sizes.shape=}")
    sublane = 8 * max(1, 4 // jnp.dtype(lhs.dtype).itemsize)
    bm = min(BLOCK_M, _round_up(m, sublane))
    bn = min(BLOCK_N, _round_up(n, 128))
    while bn > 128 and 2 * _round_up(k, 128) * bn * jnp.dtype(rhs.dtype).itemsize > 16 * _MiB:
        bn //= 2
    return _gmm(lhs, rhs, group_sizes, bm=bm, bn=_round_up(bn, 128))
