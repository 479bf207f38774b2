"""MoE layer in four kernels: route, gated grouped matmul, down grouped matmul, combine.

Only the routed work is done: each token goes through its k experts, t * k rows in all, never
through the other e - k.

1. router_kernel, grid (token blocks,): logits = x @ w_router at full float32 precision (the
   choice of expert must be the float32 one), then k rounds of "take the largest logit, the
   first expert holding it, knock that one expert out" (equal logits: lowest index first, and a
   value held twice is taken twice), and p = softmax over the k chosen logits. Out: p [t, k]
   float32 and idx [t, k] int32.
2. Between kernels (XLA, O(t * k) integers and one row gather): the (token, slot) pairs sorted
   stably by expert, the rows per expert, and x's rows gathered into that order, [t * k, d].
3. gated_gmm_kernel: h = silu(rows @ w_gate[i]) * (rows @ w_up[i]) for the rows of each expert
   i, in x.dtype, [t * k, f].
4. down_gmm_kernel: y = h @ w_down[i] per expert, in x.dtype, [t * k, d], its contraction
   (f: 14336 for Mixtral) split into BLOCK_K chunks summed in a float32 VMEM accumulator.
5. Between kernels: y's rows gathered back to token order as [k, t, d] (slot-major, so a
   block is k whole [tokens, d] slabs).
6. combine_kernel, grid (token blocks,): out = sum_j p[:, j] * y[j] in float32, cast to
   x.dtype.

Both grouped matmuls run over a work list: the (row tile, expert) pairs whose rows overlap, in
expert order, at most tiles + e - 1 of them (a static count; the items past the real ones
repeat the last real item and compute nothing). Its tile and expert ids, a real-item flag and
each expert's first and last row are scalar-prefetched into SMEM, and the index maps read them:
the row tile of the item, its expert's weight block, its output tile. Column blocks are the
outermost grid axis, so consecutive items of one expert keep its weight block's index and do
not fetch it again; items that share a row tile keep the output block in VMEM, each storing
only the rows of its own expert (a masked store), and the tile goes back to HBM once. Every row
belongs to one expert, so every output row is written once; rows past the end exist only in
a partial last tile, whose write-back is clipped. Nothing is padded.

Block sizes: each item computes a whole [bm]-row tile, and up to e - 1 items are partial, so
long row blocks pad; each item may also fetch its expert's weights, so short row blocks fetch
more. The row block (multiples of 128 up to BLOCK_M) minimises a roofline of the two at a
balance of compute to bandwidth between v5e's and v6e's; the column block is the widest that
fits the VMEM budget.
"""
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

BLOCK_T = 256  # tune: 128, 256, 512  (tokens per router and combine step)
BLOCK_M = 1024  # tune: 256, 512, 768, 1024  (rows per grouped-matmul work item, at most)
BLOCK_N = 2048  # tune: 512, 1024, 2048, 4096  (columns per grouped-matmul block, at most)
BLOCK_K = 2048  # tune: 1024, 2048, 4096  (contraction chunk of the down projection, at most)

_MiB = 1024 * 1024
_BLOCK_BUDGET = 72 * _MiB  # double-buffered blocks plus float32 temporaries
# FLOPs per HBM byte at which compute and memory times are equal: ~240 on v5e, ~560 on v6e.
# The row blocks are chosen for a chip in between.
_BALANCE = 400.0
_STEP_FLOPS = 0.35e-6 * 600e12  # a grid step's fixed cost in FLOPs of such a chip


def _round_up(x, m):
    return (x + m - 1) // m * m


def _vmem_limit(need):
    return int(min(100 * _MiB, max(32 * _MiB, need + need // 4 + 8 * _MiB)))


# --- 1. router ---------------------------------------------------------------------------------
def router_kernel(x_ref, wr_ref, p_ref, idx_ref):
    # float32 operands at full precision (several MXU passes); bf16 products are exact anyway
    full = lax.Precision.HIGHEST if x_ref.dtype == jnp.float32 else None
    logits = jnp.dot(x_ref[...], wr_ref[...], preferred_element_type=jnp.float32,
                     precision=full)                                        # [bt, e]
    bt, e = logits.shape
    k = p_ref.shape[1]
    expert = lax.broadcasted_iota(jnp.int32, (bt, e), 1)
    slot = lax.broadcasted_iota(jnp.int32, (bt, k), 1)
    chosen = jnp.zeros((bt, k), jnp.float32)
    idx = jnp.zeros((bt, k), jnp.int32)
    for r in range(k):                                                      # static: k is a shape
        best = jnp.max(logits, axis=1, keepdims=True)
        first = jnp.min(jnp.where(logits == best, expert, e), axis=1, keepdims=True)
        chosen = jnp.where(slot == r, best, chosen)
        idx = jnp.where(slot == r, first, idx)
        logits = jnp.where(expert == first, -jnp.inf, logits)               # that one expert only
    weights = jnp.exp(chosen - chosen[:, :1])                               # the first is the largest
    p_ref[...] = weights / jnp.sum(weights, axis=1, keepdims=True)
    idx_ref[...] = idx


def _route(x, w_router, k, bt):
    t, d = x.shape
    e = w_router.shape[1]
    itemsize = x.dtype.itemsize
    need = 2 * (bt * d + d * e) * itemsize + 8 * bt * 128 * 4
    return pl.pallas_call(
        router_kernel,
        grid=(pl.cdiv(t, bt),),
        in_specs=[pl.BlockSpec((bt, d), lambda i: (i, 0)), pl.BlockSpec((d, e), lambda i: (0, 0))],
        out_specs=(pl.BlockSpec((bt, k), lambda i: (i, 0)), pl.BlockSpec((bt, k), lambda i: (i, 0))),
        out_shape=(jax.ShapeDtypeStruct((t, k), jnp.float32), jax.ShapeDtypeStruct((t, k), jnp.int32)),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel",),
                                             vmem_limit_bytes=_vmem_limit(need)),
    )(x, w_router)


# --- 3, 4. grouped matmuls ----------------------------------------------------------------------
def _mine(tile_ref, group_ref, start_ref, end_ref, w, bm):
    """[bm, 1]: which rows of item w's tile belong to its expert."""
    g = group_ref[w]
    row = tile_ref[w] * bm + lax.broadcasted_iota(jnp.int32, (bm, 1), 0)
    return (row >= start_ref[g]) & (row < end_ref[g])


def gated_gmm_kernel(tile_ref, group_ref, valid_ref, start_ref, end_ref, x_ref, wg_ref, wu_ref, o_ref):
    w = pl.program_id(1)

    @pl.when(valid_ref[w] == 1)
    def _item():
        x = x_ref[...]
        gate = jnp.dot(x, wg_ref[...], preferred_element_type=jnp.float32)   # [bm, bn]
        up = jnp.dot(x, wu_ref[...], preferred_element_type=jnp.float32)
        h = (gate * jax.nn.sigmoid(gate) * up).astype(o_ref.dtype)
        mine = _mine(tile_ref, group_ref, start_ref, end_ref, w, x_ref.shape[0])
        o_ref[...] = jnp.where(mine, h, o_ref[...])


def down_gmm_kernel(tile_ref, group_ref, valid_ref, start_ref, end_ref, h_ref, wd_ref, o_ref, acc_ref):
    w, c = pl.program_id(1), pl.program_id(2)
    real = valid_ref[w] == 1

    @pl.when(c == 0)
    def _init():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    @pl.when(real)
    def _accumulate():
        acc_ref[...] += jnp.dot(h_ref[...], wd_ref[...], preferred_element_type=jnp.float32)

    @pl.when(real & (c == pl.num_programs(2) - 1))
    def _store():
        mine = _mine(tile_ref, group_ref, start_ref, end_ref, w, h_ref.shape[0])
        o_ref[...] = jnp.where(mine, acc_ref[...].astype(o_ref.dtype), o_ref[...])


def _work_list(group_sizes, bm, num_items):
    """(tile, expert, real) per work item and each expert's [start, end) rows: O(e + items)."""
    ends = jnp.cumsum(group_sizes)
    starts = ends - group_sizes
    first = starts // bm
    count = jnp.where(group_sizes > 0, (ends - 1) // bm - first + 1, 0)  # tiles each expert touches
    item_end = jnp.cumsum(count)
    total = item_end[-1]
    w = jnp.arange(num_items, dtype=jnp.int32)
    last = jnp.minimum(w, total - 1)  # trailing items repeat the last real one
    group = jnp.searchsorted(item_end, last, side="right").astype(jnp.int32)
    tile = first[group] + last - (item_end[group] - count[group])
    return (tile.astype(jnp.int32), group, (w < total).astype(jnp.int32),
            starts.astype(jnp.int32), ends.astype(jnp.int32))


def _gated_gmm(x, w_gate, w_up, group_sizes, bm, bn):
    m, d = x.shape
    e, _, f = w_gate.shape
    num_items = pl.cdiv(m, bm) + e - 1
    meta = _work_list(group_sizes, bm, num_items)
    need = 2 * (bm * d + 2 * d * bn + bm * bn) * x.dtype.itemsize + 4 * bm * bn * 4
    weight = pl.BlockSpec((pl.Squeezed(), d, bn), lambda j, w, tile, group, *_: (group[w], 0, j))
    return pl.pallas_call(
        gated_gmm_kernel,
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=len(meta),
            grid=(pl.cdiv(f, bn), num_items),
            in_specs=[pl.BlockSpec((bm, d), lambda j, w, tile, *_: (tile[w], 0)), weight, weight],
            out_specs=pl.BlockSpec((bm, bn), lambda j, w, tile, *_: (tile[w], j)),
        ),
        out_shape=jax.ShapeDtypeStruct((m, f), x.dtype),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary"),
                                             vmem_limit_bytes=_vmem_limit(need)),
    )(*meta, x, w_gate, w_up)


def _down_gmm(h, w_down, group_sizes, bm, bn, bk):
    m, f = h.shape
    e, _, d = w_down.shape
    num_items = pl.cdiv(m, bm) + e - 1
    meta = _work_list(group_sizes, bm, num_items)
    need = 2 * (bm * bk + bk * bn + bm * bn) * h.dtype.itemsize + 2 * bm * bn * 4
    return pl.pallas_call(
        down_gmm_kernel,
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=len(meta),
            grid=(pl.cdiv(d, bn), num_items, f // bk),
            in_specs=[pl.BlockSpec((bm, bk), lambda j, w, c, tile, *_: (tile[w], c)),
                      pl.BlockSpec((pl.Squeezed(), bk, bn), lambda j, w, c, tile, group, *_: (group[w], c, j))],
            out_specs=pl.BlockSpec((bm, bn), lambda j, w, c, tile, *_: (tile[w], j)),
            scratch_shapes=[pltpu.VMEM((bm, bn), jnp.float32)],   # one output tile's sum over f
        ),
        out_shape=jax.ShapeDtypeStruct((m, d), h.dtype),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary", "arbitrary"),
                                             vmem_limit_bytes=_vmem_limit(need)),
    )(*meta, h, w_down)


# --- 6. combine ---------------------------------------------------------------------------------
def combine_kernel(y_ref, p_ref, o_ref):
    acc = p_ref[:, 0:1] * y_ref[0].astype(jnp.float32)
    for j in range(1, y_ref.shape[0]):                                      # static: k
        acc = acc + p_ref[:, j:j + 1] * y_ref[j].astype(jnp.float32)
    o_ref[...] = acc.astype(o_ref.dtype)


def _combine(y, p, bt):
    k, t, d = y.shape
    need = 2 * (k * bt * d * y.dtype.itemsize + bt * 128 * 4 + bt * d * y.dtype.itemsize) + 2 * bt * d * 4
    return pl.pallas_call(
        combine_kernel,
        grid=(pl.cdiv(t, bt),),
        in_specs=[pl.BlockSpec((k, bt, d), lambda i: (0, i, 0)), pl.BlockSpec((bt, k), lambda i: (i, 0))],
        out_specs=pl.BlockSpec((bt, d), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct((t, d), y.dtype),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel",),
                                             vmem_limit_bytes=_vmem_limit(need)),
    )(y, p)


# --- block sizes --------------------------------------------------------------------------------
def _widest(n, per_col, fixed):
    """The widest column block (a multiple of 128, at most BLOCK_N) with `fixed` + `per_col` *
    width bytes in the budget, evened out over n; the whole of n when that fits in one."""
    fit = max(128, (_BLOCK_BUDGET - fixed) // per_col // 128 * 128)
    widest = min(BLOCK_N, fit)
    if n <= widest:
        return n
    return _round_up(pl.cdiv(n, pl.cdiv(n, widest)), 128)


def _gated_blocks(bm, d, f, itemsize):
    return _widest(f, 2 * 2 * d * itemsize + 2 * bm * itemsize + 4 * bm * 4, 2 * bm * d * itemsize)


def _down_blocks(bm, f, d, itemsize):
    """(bn, bk): bk the largest multiple of 128 up to BLOCK_K dividing f (f whole when it is
    not a multiple of 128), bn the widest that fits with it."""
    bk = f
    if f > BLOCK_K and f % 128 == 0:
        bk = max(c for c in range(128, BLOCK_K + 1, 128) if f % c == 0)
    bn = _widest(d, 2 * bk * itemsize + 2 * bm * itemsize + 2 * bm * 4, 2 * bm * bk * itemsize)
    return bn, bk


def _row_block(m, e, itemsize, sublane, item_cost):
    """The row block (a multiple of 128 up to BLOCK_M; a short operand is one tile) whose work
    list costs least: item_cost(bm) -> (FLOPs, bytes, grid steps) of one item, set against a
    chip with _BALANCE FLOPs per byte."""
    if m <= 128:
        return _round_up(m, sublane)
    rate = 3.0 if itemsize == 4 else 1.0  # float32 operands take several MXU passes

    def cost(bm):
        flops, nbytes, steps = item_cost(bm)
        items = pl.cdiv(m, bm) + e - 1
        return items * (max(flops * rate, nbytes * _BALANCE) + steps * _STEP_FLOPS)

    return min(min(range(128, max(128, BLOCK_M) + 1, 128), key=lambda bm: (cost(bm), bm)),
               _round_up(m, sublane))


@functools.partial(jax.jit, static_argnames=("k",))
def _moe(x, w_router, w_gate, w_up, w_down, *, k):
    t, d = x.shape
    e, _, f = w_gate.shape
    m = t * k
    itemsize = x.dtype.itemsize
    sublane = 8 * max(1, 4 // itemsize)

    def gated_item(bm):
        bn = _gated_blocks(bm, d, f, itemsize)
        cols = pl.cdiv(f, bn)
        return 4 * bm * d * cols * bn, cols * (bm * d + 2 * d * bn + bm * bn) * itemsize, cols

    def down_item(bm):
        bn, bk = _down_blocks(bm, f, d, itemsize)
        cols, chunks = pl.cdiv(d, bn), f // bk
        return 2 * bm * f * cols * bn, cols * chunks * (bm * bk + bk * bn + bm * bn) * itemsize, cols * chunks

    bt = min(BLOCK_T, _round_up(t, sublane))
    p, idx = _route(x, w_router, k, bt)

    flat = idx.reshape(-1)                                   # pair r = token * k + slot
    order = jnp.argsort(flat, stable=True).astype(jnp.int32)  # pairs in expert order
    sizes = jnp.zeros((e,), jnp.int32).at[flat].add(1)
    rows = jnp.take(x, order // k, axis=0)                   # [m, d], expert order

    bm = _row_block(m, e, itemsize, sublane, gated_item)
    h = _gated_gmm(rows, w_gate, w_up, sizes, bm, _gated_blocks(bm, d, f, itemsize))
    bm = _row_block(m, e, itemsize, sublane, down_item)
    y = _down_gmm(h, w_down, sizes, bm, *_down_blocks(bm, f, d, itemsize))

    pos = jnp.zeros((m,), jnp.int32).at[order].set(jnp.arange(m, dtype=jnp.int32))
    y = jnp.take(y, pos.reshape(t, k).T, axis=0)             # [k, t, d], token order
    return _combine(y, p, bt)


def kernel(x, slots, w_router, w_gate, w_up, w_down):
    d = x.shape[1]
    (k,) = slots.shape
    e = w_router.shape[1]
    f = w_gate.shape[2]
    if (w_router.shape != (d, e) or w_gate.shape != (e, d, f) or w_up.shape != (e, d, f)
            or w_down.shape != (e, f, d) or not 1 <= k <= e):
        raise ValueError(f"shape mismatch: {x.shape=} {slots.shape=} {w_router.shape=} {w_gate.shape=} "
                         f"{w_up.shape=} {w_down.shape=}")
    return _moe(x, w_router, w_gate, w_up, w_down, k=k)
