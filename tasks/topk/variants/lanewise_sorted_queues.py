"""Top-8 values per row via 128 per-lane sorted queues, then an 8-pop merge across lanes.

Pass 1 (pure elementwise VPU work, no cross-lane reductions): the row is viewed as 128-lane
chunks. Eight [sub, 128] f32 registers q0 >= q1 >= ... >= q7 hold, for every lane position,
the 8 largest values seen in that lane so far. Each chunk v is inserted by a compare-exchange
cascade: for t = 0..7: q_t, v = max(q_t, v), min(q_t, v). Max/min exchanges keep the
multiset, so duplicates survive as often as they occur. A row's top 8 is contained in the
union of the per-lane top 8s.

Pass 2 (the merge): 8 rounds of m = max over lanes of q0 (the queue heads); pick the first
lane holding m and pop its queue (shift q_{t+1} into q_t on that lane only, -inf into q7).
Each round yields the next largest value of the row, so the outputs come out descending and
ties repeat like lax.top_k.

Grid: one "parallel" axis over blocks of whole rows; inside, a loop over SUB_ROWS-row slices
and, per slice, a fori_loop over the 128-lane chunks. Ragged edges: when d is not a multiple of
128 the tail is read as the LAST 128 columns (x[:, d-128:d], overlapping the previous chunk)
with the already-seen lanes masked to -inf, so no padding is needed (rows narrower than 128
are padded with -inf in the wrapper). A ragged last row block computes on rows never written.
"""
import functools
import math

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

K = 8
LANES = 128
BLOCK_ROWS = 512
SUB_ROWS = 16                    # rows per pass (a multiple of the bf16 sublane tile)
_BLOCK_BYTES = 8 << 20           # one input block, in the input dtype, at most
VMEM_LIMIT_BYTES = 32 << 20


def topk_queue_kernel(x_ref, o_ref, *, k, sub, d):
    br = x_ref.shape[0]
    n_full = d // LANES
    tail = d - n_full * LANES
    lane = jax.lax.broadcasted_iota(jnp.int32, (sub, LANES), 1)

    def insert(qs, v):
        qs = list(qs)
        for t in range(k):                          # compare-exchange cascade
            hi = jnp.maximum(qs[t], v)
            v = jnp.minimum(qs[t], v)
            qs[t] = hi
        return tuple(qs)

    def rows(r, _):
        r0 = pl.multiple_of(r * sub, sub)

        def chunk(c, qs):
            c0 = pl.multiple_of(c * LANES, LANES)
            return insert(qs, x_ref[pl.ds(r0, sub), pl.ds(c0, LANES)].astype(jnp.float32))

        qs = tuple(jnp.full((sub, LANES), -jnp.inf, jnp.float32) for _ in range(k))
        qs = jax.lax.fori_loop(0, n_full, chunk, qs)
        if tail:  # static: the last 128 columns, lanes already covered masked out
            v = x_ref[pl.ds(r0, sub), d - LANES:d].astype(jnp.float32)
            qs = insert(qs, jnp.where(lane >= LANES - tail, v, -jnp.inf))

        qs = list(qs)
        best = []
        for _ in range(k):                          # pop the largest queue head k times
            m = jnp.max(qs[0], axis=1, keepdims=True)                       # [sub, 1]
            first = jnp.min(jnp.where(qs[0] == m, lane, LANES), axis=1, keepdims=True)
            pop = lane == first
            for t in range(k - 1):
                qs[t] = jnp.where(pop, qs[t + 1], qs[t])
            qs[k - 1] = jnp.where(pop, -jnp.inf, qs[k - 1])
            best.append(m)
        o_ref[pl.ds(r0, sub), :] = jnp.concatenate(best, axis=1).astype(o_ref.dtype)
        return 0

    jax.lax.fori_loop(0, br // sub, rows, 0)


@functools.partial(jax.jit, static_argnames=("br", "sub"))
def _topk_2d(x, *, br, sub):
    rows, d = x.shape
    return pl.pallas_call(
        functools.partial(topk_queue_kernel, k=K, sub=sub, d=d),
        grid=(pl.cdiv(rows, br),),
        in_specs=[pl.BlockSpec((br, d), lambda r: (r, 0))],
        out_specs=pl.BlockSpec((br, K), lambda r: (r, 0)),
        out_shape=jax.ShapeDtypeStruct((rows, K), x.dtype),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel",),
                                             vmem_limit_bytes=VMEM_LIMIT_BYTES),
    )(x)


def kernel(x):
    shape = x.shape
    d = shape[-1]
    if d < K:
        raise ValueError(f"need at least {K} values per row, got {d}")
    rows = math.prod(shape[:-1])
    x2 = x.reshape(rows, d)
    if d < LANES:  # narrower than one lane chunk: -inf never reaches the top K (d >= K)
        x2 = jnp.pad(x2, ((0, 0), (0, LANES - d)), constant_values=-jnp.inf)
    dp = x2.shape[1]
    if rows <= SUB_ROWS:
        br = sub = rows                     # one block, one pass, the full (legal) row count
    else:
        cap = min(BLOCK_ROWS, _BLOCK_BYTES // (jnp.dtype(x.dtype).itemsize * dp))
        cap = max(SUB_ROWS, cap // SUB_ROWS * SUB_ROWS)
        br, sub = min(cap, rows // SUB_ROWS * SUB_ROWS), SUB_ROWS
    out = _topk_2d(x2, br=br, sub=sub)
    return out.reshape(*shape[:-1], K)
