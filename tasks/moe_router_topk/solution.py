"""MoE router (softmax, top-k, renormalise) in one grid step that streams chunks of tokens
through VMEM with its own double-buffered DMAs, experts on sublanes and tokens on lanes.

The problem is tiny per token (8 to 64 logits in, 2k numbers out) and memory-bound, so two
things matter: few grid steps (each costs a fixed overhead comparable to moving 32768 of
Mixtral's tokens) and VMEM. Pipelined [tokens, k] output blocks would be padded from k to 128
lanes in VMEM (64x for k = 2), so whole-array blocks do not fit and small blocks cost a grid
step each. Instead the kernel is one step: the logits and outputs stay in HBM (memory space
ANY) and a fori_loop walks the tokens in chunks of CHUNK, copying chunk c + 1 in while chunk c
is computed and copying each chunk's results out while the next ones are computed (two VMEM
slots per buffer; a slot's outgoing copies are waited for before the slot is written again).

Copies of logits must start and end on the input's row tile (8 rows in float32, 16 in
bfloat16), so the chunks cover the rows up to the last whole tile, `main`, and when `main` is
not a multiple of CHUNK the last chunk ends at `main`, overlapping the one before it (it
rewrites a few rows with the same values, after that chunk's copies are done). The fewer than
16 rows past `main` are copied and computed on their own, with buffers of their exact size (a
copy that ends at the end of the array may be partial).

Per chunk, the [CHUNK, e] logits are cast to float32 and transposed to [e, CHUNK]: experts on
sublanes, tokens on all 128 lanes, so every round below is a cheap reduction across sublanes
rather than a lane reduction over a mostly empty vreg. Then k rounds of "take the maximum,
take the first expert holding it, knock that one expert out": equal logits are taken lowest
index first, and a value held twice is taken twice (only one position is knocked out per
round). The weights are exp(l_r - l_max) / sum over the k chosen of exp(l_j - l_max): the
full softmax's denominator cancels in the renormalisation, so only the k chosen logits are
exponentiated. The [k, CHUNK] results are transposed back to the [CHUNK, k] row layout of the
outputs.
"""
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

CHUNK = 512  # tune: 256, 512, 1024, 2048  (tokens per chunk: a multiple of 128)


def _route(x, k):
    """x [e, n] float32 logits (experts on sublanes) -> (weights [k, n] f32, indices [k, n] i32)."""
    e, n = x.shape
    expert = lax.broadcasted_iota(jnp.int32, (e, n), 0)
    slot = lax.broadcasted_iota(jnp.int32, (k, n), 0)
    values = jnp.zeros((k, n), jnp.float32)
    indices = jnp.zeros((k, n), jnp.int32)
    top = None
    for r in range(k):                                              # static: k is a shape
        best = jnp.max(x, axis=0, keepdims=True)                    # [1, n]
        first = jnp.min(jnp.where(x == best, expert, e), axis=0, keepdims=True)
        if r == 0:
            top = best
        values = jnp.where(slot == r, best, values)
        indices = jnp.where(slot == r, first, indices)
        x = jnp.where(expert == first, -jnp.inf, x)                 # only that one expert
    p = jnp.exp(values - top)                                       # top logit -> exp(0) = 1
    return p / jnp.sum(p, axis=0, keepdims=True), indices


def router_kernel(x_hbm, w_hbm, i_hbm, xbuf, wbuf, ibuf, xtail, wtail, itail, sems, *, k, chunk,
                  main):
    """Rows [0, main) in chunks of `chunk` (both multiples of the input's row tile), the rest
    (fewer than a row tile) as one piece of its own size."""
    t = x_hbm.shape[0]
    tail = t - main
    n = pl.cdiv(main, chunk) if main else 0                         # static
    overlap = n > 1 and main % chunk != 0   # the last chunk ends at `main`, overlapping the one before

    def rows(c):
        return pl.ds(jnp.minimum(c * chunk, main - chunk), chunk)

    def copy_in(c, slot):
        return pltpu.make_async_copy(x_hbm.at[rows(c)], xbuf.at[slot], sems.at[0, slot])

    def copies_out(c, slot):
        return (pltpu.make_async_copy(wbuf.at[slot], w_hbm.at[rows(c)], sems.at[1, slot]),
                pltpu.make_async_copy(ibuf.at[slot], i_hbm.at[rows(c)], sems.at[2, slot]))

    def wait_out(c, slot):
        for cp in copies_out(c, slot):
            cp.wait()

    def compute(x_ref, w_ref, i_ref):
        x = x_ref[...].astype(jnp.float32).T                        # [e, rows]
        weights, indices = _route(x, k)
        w_ref[...] = weights.T                                      # [rows, k]
        i_ref[...] = indices.T

    def body(c, carry):
        slot = lax.rem(c, 2)

        @pl.when(c + 1 < n)
        def _prefetch():
            copy_in(c + 1, 1 - slot).start()

        copy_in(c, slot).wait()

        @pl.when(c >= 2)
        def _slot_free():                           # chunk c - 2's results have left this slot
            wait_out(c - 2, slot)

        compute(xbuf.at[slot], wbuf.at[slot], ibuf.at[slot])
        if overlap:
            @pl.when(c == n - 1)
            def _rows_free():                       # the rows it writes again (same values)
                wait_out(c - 1, 1 - slot)

        for cp in copies_out(c, slot):
            cp.start()
        return carry

    if tail:
        tail_rows = pl.ds(main, tail)
        tail_in = pltpu.make_async_copy(x_hbm.at[tail_rows], xtail, sems.at[0, 2])
        tail_out = (pltpu.make_async_copy(wtail, w_hbm.at[tail_rows], sems.at[1, 2]),
                    pltpu.make_async_copy(itail, i_hbm.at[tail_rows], sems.at[2, 2]))
        tail_in.start()
    if n:
        copy_in(0, 0).start()
        lax.fori_loop(0, n, body, 0)
        for c in range(n - 1 if overlap else max(0, n - 2), n):     # the copies still in flight
            wait_out(c, c % 2)
    if tail:
        tail_in.wait()
        compute(xtail, wtail, itail)
        for cp in tail_out:
            cp.start()
        for cp in tail_out:
            cp.wait()


@functools.partial(jax.jit, static_argnames=("k", "chunk", "main"))
def _router(logits, *, k, chunk, main):
    t, e = logits.shape
    tail = max(t - main, 1)  # (a 1-row tail buffer when there is no tail: never used)
    out_shape = (jax.ShapeDtypeStruct((t, k), jnp.float32), jax.ShapeDtypeStruct((t, k), jnp.int32))
    return pl.pallas_call(
        functools.partial(router_kernel, k=k, chunk=chunk, main=main),
        in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
        out_specs=(pl.BlockSpec(memory_space=pl.ANY), pl.BlockSpec(memory_space=pl.ANY)),
        out_shape=out_shape,
        scratch_shapes=[pltpu.VMEM((2, chunk, e), logits.dtype),    # logits chunks
                        pltpu.VMEM((2, chunk, k), jnp.float32),     # weights
                        pltpu.VMEM((2, chunk, k), jnp.int32),       # indices
                        pltpu.VMEM((tail, e), logits.dtype),        # the tail's logits,
                        pltpu.VMEM((tail, k), jnp.float32),         # weights
                        pltpu.VMEM((tail, k), jnp.int32),           # and indices
                        pltpu.SemaphoreType.DMA((3, 3))],           # [in | weights | indices, slot | tail]
    )(logits)


def kernel(logits, slots):
    t, e = logits.shape
    (k,) = slots.shape
    if not 1 <= k <= e:
        raise ValueError(f"k={k} must be in [1, e={e}]")
    tile = 8 * (4 // logits.dtype.itemsize)  # rows per (8, 128) tile of the logits' dtype
    main = t // tile * tile
    return _router(logits, k=k, chunk=min(CHUNK, max(main, tile)), main=main)
