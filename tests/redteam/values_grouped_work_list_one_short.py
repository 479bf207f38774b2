"""Values the task's inputs never produce: the gated grouped matmul's work list sized with the
row tiles floored (`m // bm` for `pl.cdiv(m, bm)`). A list of tiles + e - 1 items is one short
only when the partial last tile is there (m not a multiple of bm) and every one of the e - 1
group boundaries falls inside a tile with no expert empty; the task's default groups always
leave one expert empty, which pays for the missing item. A router spreading a large batch over
8 or 64 experts gives every expert rows, and the last tile's last group is never computed.
task: gated_grouped_matmul  expect: wrong_output
wrong at: stress=busy_groups"""
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

BLOCK_M = 1024  # tune: 256, 512, 768, 1024  (rows per work item, at most)
BLOCK_N = 2048  # tune: 512, 1024, 2048, 4096  (columns per block, at most)

_MiB = 1024 * 1024
_BLOCK_BUDGET = 72 * _MiB  # double-buffered blocks plus the float32 temporaries
# FLOPs per byte of HBM traffic at which a chip's compute and memory times are equal: about 240
# on v5e and 560 on v6e. The row block is chosen for the latter: longer blocks cost v5e some
# padded rows, shorter ones cost v6e more weight fetches than it can hide.
_BALANCE = 560.0
_STEP_FLOPS = 0.35e-6 * 920e12  # a grid step's fixed cost, in FLOPs of such a chip (v6e)


def _round_up(x, m):
    return (x + m - 1) // m * m


def gated_gmm_kernel(tile_ref, group_ref, valid_ref, start_ref, end_ref,
                     x_ref, wg_ref, wu_ref, o_ref):
    w = pl.program_id(1)

    @pl.when(valid_ref[w] == 1)
    def _item():
        g = group_ref[w]
        bm = x_ref.shape[0]
        row = tile_ref[w] * bm + lax.broadcasted_iota(jnp.int32, (bm, 1), 0)
        mine = (row >= start_ref[g]) & (row < end_ref[g])                     # [bm, 1]
        x = x_ref[...]
        gate = jnp.dot(x, wg_ref[...], preferred_element_type=jnp.float32)   # [bm, bn]
        up = jnp.dot(x, wu_ref[...], preferred_element_type=jnp.float32)
        h = (gate * jax.nn.sigmoid(gate) * up).astype(o_ref.dtype)
        o_ref[...] = jnp.where(mine, h, o_ref[...])


def _work_list(group_sizes, bm, num_items):
    """(tile, group, valid) per work item and each group's [start, end) rows: O(e + items)."""
    sizes = group_sizes.astype(jnp.int32)
    ends = jnp.cumsum(sizes)
    starts = ends - sizes
    first = starts // bm
    count = jnp.where(sizes > 0, (ends - 1) // bm - first + 1, 0)  # tiles each group touches
    item_end = jnp.cumsum(count)
    total = item_end[-1]
    w = jnp.arange(num_items, dtype=jnp.int32)
    last = jnp.minimum(w, total - 1)  # trailing items repeat the last real one
    group = jnp.searchsorted(item_end, last, side="right").astype(jnp.int32)
    tile = first[group] + last - (item_end[group] - count[group])
    return (tile.astype(jnp.int32), group, (w < total).astype(jnp.int32),
            starts.astype(jnp.int32), ends.astype(jnp.int32))


@functools.partial(jax.jit, static_argnames=("bm", "bn"))
def _gated_gmm(x, w_gate, w_up, group_sizes, *, bm, bn):
    m, k = x.shape
    e, _, n = w_gate.shape
    tiles = m // bm  # floored: one work item short when every boundary is mid-tile
    num_items = tiles + e - 1
    meta = _work_list(group_sizes, bm, num_items)
    itemsize = x.dtype.itemsize
    need = 2 * (bm * k + 2 * k * bn + bm * bn) * itemsize + 4 * bm * bn * 4
    weight_spec = pl.BlockSpec((pl.Squeezed(), k, bn), lambda j, w, tile, group, *_: (group[w], 0, j))
    return pl.pallas_call(
        gated_gmm_kernel,
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=len(meta),
            grid=(pl.cdiv(n, bn), num_items),
            in_specs=[pl.BlockSpec((bm, k), lambda j, w, tile, *_: (tile[w], 0)),
                      weight_spec, weight_spec],
            out_specs=pl.BlockSpec((bm, bn), lambda j, w, tile, *_: (tile[w], j)),
        ),
        out_shape=jax.ShapeDtypeStruct((m, n), x.dtype),
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "arbitrary"),
            vmem_limit_bytes=int(min(100 * _MiB, max(32 * _MiB, need + need // 4 + 8 * _MiB)))),
    )(*meta, x, w_gate, w_up)


def _column_block(n, k, bm, itemsize):
    """The widest column block (a multiple of 128, at most BLOCK_N) whose blocks fit, evened
    out over n; the whole of n when that fits in one."""
    per_col = 2 * 2 * k * itemsize + 2 * bm * itemsize + 4 * bm * 4
    fit = max(128, (_BLOCK_BUDGET - 2 * bm * k * itemsize) // per_col // 128 * 128)
    widest = min(BLOCK_N, fit)
    if n <= widest:
        return n
    blocks = pl.cdiv(n, widest)
    return _round_up(pl.cdiv(n, blocks), 128)


def _blocks(m, k, n, e, itemsize, sublane):
    """(bm, bn). The row block balances the two costs of a work item: its matmuls over a whole
    [bm]-row tile, of which up to e - 1 items are partial (larger bm: more padded rows), against
    fetching an expert's weight slabs and the tile of x for it (smaller bm: more items, each a
    fetch when the index maps cannot tell in advance whether the expert changed). Multiples of
    128 rows up to BLOCK_M; a short x is one tile. The column block follows from the row block
    (_column_block)."""
    if m <= 128:
        bm = _round_up(m, sublane)
        return bm, _column_block(n, k, bm, itemsize)
    rate = 3.0 if itemsize == 4 else 1.0  # float32 operands take several MXU passes

    def cost(bm):
        bn = _column_block(n, k, bm, itemsize)
        cols = pl.cdiv(n, bn)
        items = pl.cdiv(m, bm) + e - 1
        compute = items * bm * 4 * k * cols * bn * rate
        traffic = items * cols * (2 * k * bn + bm * k + bm * bn) * itemsize * _BALANCE
        return max(compute, traffic) + items * cols * _STEP_FLOPS

    bm = min(range(128, max(128, BLOCK_M) + 1, 128), key=lambda bm: (cost(bm), bm))
    bm = min(bm, _round_up(m, sublane))
    return bm, _column_block(n, k, bm, itemsize)


def kernel(x, w_gate, w_up, group_sizes):
    m, k = x.shape
    e, k2, n = w_gate.shape
    if k2 != k or w_up.shape != w_gate.shape or group_sizes.shape != (e,):
        raise ValueError(f"shape mismatch: {x.shape=} {w_gate.shape=} {w_up.shape=} {group_sizes.shape=}")
    itemsize = jnp.dtype(x.dtype).itemsize
    sublane = 8 * max(1, 4 // itemsize)  # 8 rows for f32, 16 for bf16
    bm, bn = _blocks(m, k, n, e, itemsize, sublane)
    return _gated_gmm(x, w_gate, w_up, group_sizes, bm=bm, bn=bn)
