"""Grouped matmul on a (row tile, column tile, group) grid with the group as the reduction axis.

Grid (M tiles "parallel", N tiles "parallel", g "arbitrary"). Scalar prefetch carries, per row
tile, the first and last group owning one of its rows (lo, hi), and per group its row range
[start, end). The rhs index map clamps the group axis into the tile's range, rhs block =
rhs[clamp(gi, lo, hi)][:, cols]: for the steps before lo and after hi the block index does not
change, so Pallas issues no new copy, and each tile fetches only the (hi - lo + 1) weight slabs
it needs. The kernel multiplies only when lo <= gi <= hi and group gi is non-empty: lhs rows
outside [start, end) are zeroed, and the [bm, k] x [k, bn] product is added to an f32 VMEM
accumulator, which is zeroed at gi == 0 and cast into the output block at gi == g - 1.

Unlike a work list, the grid is a fixed dense product (tiles x groups); out-of-range steps cost
only the grid-step overhead.

Ragged edges: the wrapper zero-pads m to the row block, k to a multiple of 128 (zero columns
add nothing) and n to the column block; padded rows belong to no group (their tile range stops
at the last real row) and are sliced off with the padded columns.
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


def gmm_kernel(lo_ref, hi_ref, start_ref, end_ref, lhs_ref, rhs_ref, o_ref, acc_ref):
    i, gi = pl.program_id(0), pl.program_id(2)
    bm = lhs_ref.shape[0]

    @pl.when(gi == 0)
    def _init():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    start, end = start_ref[gi], end_ref[gi]

    @pl.when((gi >= lo_ref[i]) & (gi <= hi_ref[i]) & (start < end))
    def _accumulate():
        row = i * bm + lax.broadcasted_iota(jnp.int32, (bm, 1), 0)
        lhs = lhs_ref[...]
        lhs = jnp.where((row >= start) & (row < end), lhs, jnp.zeros_like(lhs))
        acc_ref[...] += jnp.dot(lhs, rhs_ref[...], preferred_element_type=jnp.float32)

    @pl.when(gi == pl.num_programs(2) - 1)
    def _store():
        o_ref[...] = acc_ref[...].astype(o_ref.dtype)


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
    lo = jnp.searchsorted(ends, tile_first, side="right").astype(jnp.int32)
    hi = jnp.searchsorted(ends, tile_last, side="right").astype(jnp.int32)
    lo, hi = jnp.minimum(lo, g - 1), jnp.minimum(hi, g - 1)

    def rhs_map(i, j, gi, lo_ref, hi_ref, start_ref, end_ref):
        return (jnp.minimum(jnp.maximum(gi, lo_ref[i]), hi_ref[i]), 0, j)

    itemsize = lhs.dtype.itemsize
    need = 2 * (bm * kp + kp * bn + bm * bn) * itemsize + 2 * bm * bn * 4 + bm * kp * 4
    out = pl.pallas_call(
        gmm_kernel,
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=4,
            grid=(mp // bm, np_ // bn, g),
            in_specs=[pl.BlockSpec((bm, kp), lambda i, j, gi, *_: (i, 0)),
                      pl.BlockSpec((pl.squeezed, kp, bn), rhs_map)],
            out_specs=pl.BlockSpec((bm, bn), lambda i, j, gi, *_: (i, j)),
            scratch_shapes=[pltpu.VMEM((bm, bn), jnp.float32)],
        ),
        out_shape=jax.ShapeDtypeStruct((mp, np_), lhs.dtype),
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "arbitrary"),
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
    # Keep a double-buffered [k, bn] weight slab modest for long k.
    while bn > 128 and 2 * _round_up(k, 128) * bn * jnp.dtype(rhs.dtype).itemsize > 16 * _MiB:
        bn //= 2
    return _gmm(lhs, rhs, group_sizes, bm=bm, bn=_round_up(bn, 128))
