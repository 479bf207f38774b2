"""Grouped matmul over a prefetched work list of (row tile, group) pairs.

The wrapper pads m to the row block and k, n to their blocks, then lists every (row tile,
group) pair whose rows overlap, ordered by group and then tile; since groups are consecutive
row ranges, each row tile's pairs are consecutive in the list. The list is scalar-prefetched
into SMEM and the index maps use it to pick the lhs tile, the rhs group and the output tile.
Grid (n tiles, work items, k tiles): an f32 VMEM accumulator is zeroed on a tile's first
pair, collects each pair's rows (rows outside the pair's group masked to zero), and is
written out on the tile's last pair. The list has the static length num_row_tiles + g - 1
(the most pairs there can be); unused trailing items repeat the last real item with nothing
to compute, so their blocks are not refetched and results are unchanged.
"""
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu


def _round_up(x, m):
    return (x + m - 1) // m * m


def gmm_kernel(tile_ref, group_ref, first_ref, last_ref, valid_ref, start_ref, end_ref,
               lhs_ref, rhs_ref, out_ref, acc_ref):
    w = pl.program_id(1)
    kk = pl.program_id(2)
    bm = lhs_ref.shape[0]

    @pl.when((first_ref[w] == 1) & (kk == 0))
    def _init():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    @pl.when(valid_ref[w] == 1)
    def _accumulate():
        group = group_ref[w]
        row = tile_ref[w] * bm + jax.lax.broadcasted_iota(jnp.int32, lhs_ref.shape, 0)
        in_group = (row >= start_ref[group]) & (row < end_ref[group])
        lhs = jnp.where(in_group, lhs_ref[...], jnp.zeros_like(lhs_ref))
        acc_ref[...] += jnp.dot(lhs, rhs_ref[...], preferred_element_type=jnp.float32)

    @pl.when((last_ref[w] == 1) & (kk == pl.num_programs(2) - 1))
    def _store():
        out_ref[...] = acc_ref[...].astype(out_ref.dtype)


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


@functools.partial(jax.jit, static_argnames=("bm", "bk", "bn"))
def _gmm(lhs, rhs, group_sizes, *, bm, bk, bn):
    m, k = lhs.shape
    g, _, n = rhs.shape
    mp, kp, np_ = _round_up(m, bm), _round_up(k, bk), _round_up(n, bn)
    # Zero padding is exact: padded k contributes nothing, padded rows belong to no group.
    lhs_p = jnp.pad(lhs, ((0, mp - m), (0, kp - k)))
    rhs_p = jnp.pad(rhs, ((0, 0), (0, kp - k), (0, np_ - n)))
    num_tiles = mp // bm
    num_items = num_tiles + g - 1
    meta = _work_list(group_sizes, bm, num_items)

    def lhs_map(j, w, kk, tile, group, *_):
        return tile[w], kk

    def rhs_map(j, w, kk, tile, group, *_):
        return group[w], kk, j

    def out_map(j, w, kk, tile, group, *_):
        return tile[w], j

    out = pl.pallas_call(
        gmm_kernel,
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=len(meta),
            grid=(np_ // bn, num_items, kp // bk),
            in_specs=[
                pl.BlockSpec((bm, bk), lhs_map),
                pl.BlockSpec((pl.Squeezed(), bk, bn), rhs_map),
            ],
            out_specs=pl.BlockSpec((bm, bn), out_map),
            scratch_shapes=[pltpu.VMEM((bm, bn), jnp.float32)],
        ),
        out_shape=jax.ShapeDtypeStruct((mp, np_), lhs.dtype),
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "arbitrary", "arbitrary")),
    )(*meta, lhs_p, rhs_p)
    return out[:m, :n]


def kernel(lhs, rhs, group_sizes):
    m, k = lhs.shape
    g, k2, n = rhs.shape
    if k != k2 or group_sizes.shape != (g,):
        raise ValueError(f"shape mismatch: {lhs.shape=} {rhs.shape=} {group_sizes.shape=}")
    sublane = 8 * max(1, 4 // jnp.dtype(lhs.dtype).itemsize)  # 8 rows for f32, 16 for bf16
    bm = min(256, _round_up(m, sublane))
    bk = min(512, _round_up(k, 128))
    bn = min(512, _round_up(n, 128))
    return _gmm(lhs, rhs, group_sizes, bm=bm, bk=bk, bn=bn)
