"""Grouped matmul over a prefetched work list of (row tile, group) pairs.

The wrapper pads m to the row block and k to a multiple of 128, then lists every (row tile,
group) pair whose rows overlap, ordered by group and then tile; since groups are consecutive
row ranges, each row tile's pairs are consecutive in the list. The list is scalar-prefetched
into SMEM. Its static length is num_row_tiles + g - 1 (the most pairs there can be); unused
trailing items repeat the last real item with nothing to compute.

Grid (n tiles,): one grid step per [*, bn] column slab of the output. Its rhs block is the
[k, bn] slab of *every* group, [g, k, bn], so each weight is read from HBM once; the kernel
picks a pair's group inside VMEM. Within the step a loop walks the work list: the pair's
[bm, k] lhs row tile comes in by manual DMA (double-buffered: the next item's tile is in flight
while this one computes), its rows outside the group are masked to zero, and the product with
the group's slab accumulates into an f32 [bm, bn] VMEM tile; on the tile's last pair the result
goes back to HBM by manual DMA (two staging buffers, so a write overlaps the next items).
Index maps that read the work list would cost a block copy on every grid step; walking the list
inside one step copies only what each item needs, and the grid stays a few steps long.

Block sizes: every extra work item (up to g - 1) computes a whole [bm, k] x [k, bn] product,
so the row block is short (BLOCK_M = 128); the lhs is re-read once per column slab, so the
column block is as wide as the all-groups slab allows in VMEM (BLOCK_N, capped by
_RHS_SLAB_BUDGET). When even a 128-wide slab of every group does not fit (many groups, long k),
the kernel instead DMAs the pair's own [k, bn] rhs block with each item.
"""
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

# Block sizes (python -m evaluator tune searches these); capped at the aligned dims.
BLOCK_M = 128
BLOCK_N = 2048

_MiB = 1024 * 1024
_RHS_SLAB_BUDGET = 64 * _MiB  # the [g, k, bn] slab of every group (single-buffered)


def _round_up(x, m):
    return (x + m - 1) // m * m


def gmm_kernel(tile_ref, group_ref, first_ref, last_ref, valid_ref, start_ref, end_ref,
               lhs_hbm, rhs_in, out_hbm, lhs_buf, rhs_buf, acc_ref, out_buf, sems, *,
               num_items, resident):
    j = pl.program_id(0)
    bm = lhs_buf.shape[1]
    bn = acc_ref.shape[1]
    cols = pl.ds(pl.multiple_of(j * bn, bn), bn)

    def rows(w):
        return pl.ds(pl.multiple_of(tile_ref[w] * bm, bm), bm)

    def in_copies(w, slot):
        copies = [pltpu.make_async_copy(lhs_hbm.at[rows(w)], lhs_buf.at[slot], sems.at[0, slot])]
        if not resident:  # rhs_in is the whole [g, k, n] array in HBM
            copies.append(pltpu.make_async_copy(rhs_in.at[group_ref[w], :, cols],
                                                rhs_buf.at[slot], sems.at[1, slot]))
        return copies

    def out_copy(w, slot):
        return pltpu.make_async_copy(out_buf.at[slot], out_hbm.at[rows(w), cols],
                                     sems.at[2, slot])

    for copy in in_copies(0, 0):
        copy.start()

    def body(w, n_out):  # n_out: output tiles sent so far (the last two may be in flight)
        slot = lax.rem(w, 2)

        @pl.when(w + 1 < num_items)
        def _prefetch_next():
            for copy in in_copies(w + 1, 1 - slot):
                copy.start()

        for copy in in_copies(w, slot):
            copy.wait()

        @pl.when(first_ref[w] == 1)
        def _init():
            acc_ref[...] = jnp.zeros_like(acc_ref)

        @pl.when(valid_ref[w] == 1)
        def _accumulate():
            group = group_ref[w]
            row = tile_ref[w] * bm + lax.broadcasted_iota(jnp.int32, (bm, 1), 0)
            in_group = (row >= start_ref[group]) & (row < end_ref[group])      # [bm, 1]
            lhs = lhs_buf[slot]
            lhs = jnp.where(in_group, lhs, jnp.zeros_like(lhs))
            rhs = rhs_in[group] if resident else rhs_buf[slot]                  # [k, bn]
            acc_ref[...] += jnp.dot(lhs, rhs, preferred_element_type=jnp.float32)

        is_last = last_ref[w] == 1
        out_slot = lax.rem(n_out, 2)

        @pl.when(is_last)
        def _send():
            @pl.when(n_out >= 2)
            def _slot_free():  # the write two tiles back used this staging buffer
                out_copy(w, out_slot).wait()

            out_buf[out_slot] = acc_ref[...].astype(out_buf.dtype)
            out_copy(w, out_slot).start()

        return n_out + is_last.astype(jnp.int32)

    n_out = lax.fori_loop(0, num_items, body, jnp.int32(0))

    # Drain the writes still in flight: the last one, and the one before it if there was one.
    out_copy(0, lax.rem(n_out - 1, 2)).wait()

    @pl.when(n_out >= 2)
    def _drain_other():
        out_copy(0, lax.rem(n_out, 2)).wait()


def _work_list(group_sizes, bm, num_items):
    """(tile, group, first, last, valid) per work item, group starts and ends: O(g + tiles)."""
    sizes = group_sizes.astype(jnp.int32)
    ends = jnp.cumsum(sizes)
    starts = ends - sizes
    first_tile = starts // bm
    last_tile = (ends - 1) // bm
    count = jnp.where(sizes > 0, last_tile - first_tile + 1, 0)  # tiles each group touches
    item_end = jnp.cumsum(count)
    item_start = item_end - count
    total = item_end[-1]

    w = jnp.arange(num_items, dtype=jnp.int32)
    valid = w < total
    w_real = jnp.minimum(w, total - 1)  # trailing items repeat the last real one
    # The group of item w: the first group whose items end after w (empty groups own none).
    group = jnp.searchsorted(item_end, w_real, side="right").astype(jnp.int32)
    tile = (first_tile[group] + (w_real - item_start[group])).astype(jnp.int32)
    first = valid & jnp.concatenate([jnp.ones((1,), bool), tile[1:] != tile[:-1]])
    last = jnp.concatenate([tile[1:] != tile[:-1], jnp.ones((1,), bool)])
    as_i32 = lambda a: a.astype(jnp.int32)
    return (tile, group, as_i32(first), as_i32(last), as_i32(valid),
            as_i32(starts), as_i32(ends))


@functools.partial(jax.jit, static_argnames=("bm", "bn", "resident"))
def _gmm(lhs, rhs, group_sizes, *, bm, bn, resident):
    m, k = lhs.shape
    g, _, n = rhs.shape
    mp, kp, np_ = _round_up(m, bm), _round_up(k, 128), _round_up(n, bn)
    # Zero padding is exact: padded k contributes nothing, padded rows belong to no group. The
    # resident rhs slab is a pipelined block: its last column block may overhang n (those
    # columns only reach output columns that are sliced off), so n is padded only for the
    # per-item DMAs, which must stay in bounds.
    lhs_p = jnp.pad(lhs, ((0, mp - m), (0, kp - k)))
    rhs_p = jnp.pad(rhs, ((0, 0), (0, kp - k), (0, 0 if resident else np_ - n)))
    num_items = mp // bm + g - 1
    meta = _work_list(group_sizes, bm, num_items)
    itemsize = lhs.dtype.itemsize

    if resident:
        rhs_spec = pl.BlockSpec((g, kp, bn), lambda j, *_: (0, 0, j),
                                pipeline_mode=pl.Buffered(1))
        rhs_scratch = pltpu.VMEM((1, 8, 128), rhs.dtype)   # unused
        rhs_vmem = g * kp * bn * itemsize
    else:
        rhs_spec = pl.BlockSpec(memory_space=pl.ANY)
        rhs_scratch = pltpu.VMEM((2, kp, bn), rhs.dtype)
        rhs_vmem = 2 * kp * bn * itemsize
    need = rhs_vmem + 2 * (bm * kp + bm * bn) * itemsize + bm * bn * 4 + bm * kp * 4
    out = pl.pallas_call(
        functools.partial(gmm_kernel, num_items=num_items, resident=resident),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=len(meta),
            grid=(np_ // bn,),
            in_specs=[pl.BlockSpec(memory_space=pl.ANY), rhs_spec],
            out_specs=pl.BlockSpec(memory_space=pl.ANY),
            scratch_shapes=[
                pltpu.VMEM((2, bm, kp), lhs.dtype),    # lhs row tiles, double-buffered
                rhs_scratch,                           # per-item rhs blocks (not resident)
                pltpu.VMEM((bm, bn), jnp.float32),     # accumulator of one output tile
                pltpu.VMEM((2, bm, bn), lhs.dtype),    # output tiles on their way to HBM
                pltpu.SemaphoreType.DMA((3, 2)),       # [lhs|rhs|out, slot]
            ],
        ),
        out_shape=jax.ShapeDtypeStruct((mp, np_), lhs.dtype),
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("arbitrary",),
            vmem_limit_bytes=min(100 * _MiB, max(32 * _MiB, need + need // 4 + 4 * _MiB))),
    )(*meta, lhs_p, rhs_p)
    return out[:m, :n]


def kernel(lhs, rhs, group_sizes):
    m, k = lhs.shape
    g, k2, n = rhs.shape
    if k != k2 or group_sizes.shape != (g,):
        raise ValueError(f"shape mismatch: {lhs.shape=} {rhs.shape=} {group_sizes.shape=}")
    itemsize = jnp.dtype(lhs.dtype).itemsize
    sublane = 8 * max(1, 4 // itemsize)  # 8 rows for f32, 16 for bf16
    bm = min(BLOCK_M, _round_up(m, sublane))
    bn = min(BLOCK_N, _round_up(n, 128))
    # The widest column block (a multiple of 128, at most bn) whose all-groups slab fits.
    slab_cols = _RHS_SLAB_BUDGET // (g * _round_up(k, 128) * itemsize) // 128 * 128
    resident = slab_cols >= 128
    if resident:
        bn = min(bn, slab_cols)
    # As many column blocks as that needs, evened out so the last one is not mostly padding.
    blocks = pl.cdiv(_round_up(n, 128), bn)
    bn = _round_up(pl.cdiv(_round_up(n, 128), blocks), 128)
    return _gmm(lhs, rhs, group_sizes, bm=bm, bn=bn, resident=resident)
