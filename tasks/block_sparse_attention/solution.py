"""Causal block-sparse flash attention: a head's keys and values resident in VMEM, each query
block looping over a compacted list of its on key blocks, scalar-prefetched to SMEM.

The layout is compacted outside the kernel (integer glue, O(L * nb^3) over the [L, nb, nb]
layout, nothing next to the attention): for every (layout head, query block) row, counts[row]
is the number of on key blocks strictly left of the diagonal and cols[row, :counts[row]] their
indices, ascending. Both are scalar-prefetched into SMEM.

Grid (batch, heads, query steps), all "parallel". The k and v blocks are a head's whole
sequence (their index map ignores the query axis), so every operand crosses HBM once; q and o
move in blocks of BLOCK_Q rows, a few layout rows. For each of its query blocks i the kernel
runs an online softmax (row max m, row sum l, float32 accumulator, in the loop carry) over the
counts[row] off-diagonal blocks the list names, reading each from the resident k and v at
cols[row, t] * 128: the off blocks are never touched. Off-diagonal blocks lie wholly below the
diagonal and need no mask. Then the diagonal block, which the task keeps on in every layout,
with the causal mask inside it, closes the row, and acc / l is stored.

A sequence that is not a multiple of 128 ends inside the last block, which only its own query
block reaches (as its diagonal): the key rows past the end are masked by causality (they come
after every real query), the value rows past it are zeroed (stale VMEM; 0 * NaN is NaN), and
query rows past it are computed on stale data but never written back. A one-layout-for-all
(L = 1) layout is read at head 0.
"""
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

SPAN = 128  # tokens per layout block: the task's, not a tiling choice
BLOCK_Q = 1024  # tune: 128, 256, 512, 1024, 2048  (query rows per grid step, a multiple of SPAN)
_MASK_VALUE = -1e30  # finite: exp(_MASK_VALUE - m) is 0, never exp(-inf + inf) = NaN
_QK = (((1,), (1,)), ((), ()))  # [bq, d] x [bk, d] -> [bq, bk]
_MIB = 1 << 20


def _compact(layout):
    """(counts[L * nb], cols[L * nb * nb]) int32: per (layout head, query block) row, the number
    of on key blocks strictly before the diagonal, and their indices ascending (the slots past
    the count hold nb - 1, never read)."""
    heads, nb, _ = layout.shape
    blocks = jnp.arange(nb, dtype=jnp.int32)
    on = (layout != 0) & (blocks[None, :] < blocks[:, None])[None]   # [L, nb, nb]
    counts = jnp.sum(on, axis=-1, dtype=jnp.int32)                   # [L, nb]
    seen = jnp.cumsum(on.astype(jnp.int32), axis=-1)                 # on blocks in [0, j]
    # Slot t names the first j with seen[j] > t: the number of j with seen[j] <= t.
    cols = jnp.sum(seen[:, :, None, :] <= blocks[:, None], axis=-1, dtype=jnp.int32)
    return counts.reshape(-1), jnp.minimum(cols, nb - 1).reshape(-1)


def sparse_kernel(counts_ref, cols_ref, q_ref, k_ref, v_ref, o_ref, *, nb, rows, per_head, scale,
                  seq_len):
    head = pl.program_id(1) if per_head else 0
    step = pl.program_id(2)
    head_dim = q_ref.shape[-1]

    def update(carry, s, v):
        m_prev, l_prev, acc_prev = carry
        m_new = jnp.maximum(m_prev, jnp.max(s, axis=-1, keepdims=True))
        alpha = jnp.exp(m_prev - m_new)
        p = jnp.exp(s - m_new)
        l_new = alpha * l_prev + jnp.sum(p, axis=-1, keepdims=True)
        acc_new = alpha * acc_prev + jnp.dot(p.astype(v.dtype), v, preferred_element_type=jnp.float32)
        return m_new, l_new, acc_new

    def query_block(r, _):
        i = step * rows + r                                          # the layout row
        row = head * nb + i
        local = pl.ds(pl.multiple_of(r * SPAN, SPAN), SPAN)
        q = q_ref[local, :]

        def off_diagonal(t, carry):
            start = pl.multiple_of(cols_ref[row * nb + t] * SPAN, SPAN)
            k = k_ref[pl.ds(start, SPAN), :]
            s = lax.dot_general(q, k, _QK, preferred_element_type=jnp.float32) * scale
            return update(carry, s, v_ref[pl.ds(start, SPAN), :])

        init = (jnp.full((SPAN, 1), -jnp.inf, jnp.float32), jnp.zeros((SPAN, 1), jnp.float32),
                jnp.zeros((SPAN, head_dim), jnp.float32))
        carry = lax.fori_loop(0, counts_ref[row], off_diagonal, init)

        start = pl.multiple_of(i * SPAN, SPAN)
        k = k_ref[pl.ds(start, SPAN), :]
        v = v_ref[pl.ds(start, SPAN), :]
        s = lax.dot_general(q, k, _QK, preferred_element_type=jnp.float32) * scale
        query = lax.broadcasted_iota(jnp.int32, s.shape, 0)
        key = lax.broadcasted_iota(jnp.int32, s.shape, 1)
        s = jnp.where(key <= query, s, _MASK_VALUE)
        if seq_len % SPAN:  # static: the last block's rows past the sequence are stale VMEM
            key_row = start + lax.broadcasted_iota(jnp.int32, v.shape, 0)
            v = jnp.where(key_row < seq_len, v, jnp.zeros_like(v))
        _, l, acc = update(carry, s, v)
        o_ref[local, :] = (acc / l).astype(o_ref.dtype)
        return 0

    if nb % rows == 0:
        lax.fori_loop(0, rows, query_block, 0)
    else:  # the last step holds fewer layout rows
        lax.fori_loop(0, jnp.minimum(rows, nb - step * rows), query_block, 0)


@functools.partial(jax.jit, static_argnames=("rows",))
def _block_sparse(q, k, v, layout, *, rows):
    batch, heads, seq, head_dim = q.shape
    nb = layout.shape[1]
    counts, cols = _compact(layout)
    body = functools.partial(sparse_kernel, nb=nb, rows=rows, per_head=layout.shape[0] > 1,
                             scale=head_dim ** -0.5, seq_len=seq)
    q_spec = pl.BlockSpec((None, None, rows * SPAN, head_dim), lambda b, h, i, *_: (b, h, i, 0))
    kv_spec = pl.BlockSpec((None, None, nb * SPAN, head_dim), lambda b, h, i, *_: (b, h, 0, 0))
    itemsize = q.dtype.itemsize
    vmem = (4 * (rows + nb) * SPAN * head_dim * itemsize          # double-buffered q, o, k, v
            + 8 * SPAN * SPAN * 4 + 4 * SPAN * head_dim * 4 + 8 * _MIB)
    return pl.pallas_call(
        body,
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=2,
            grid=(batch, heads, pl.cdiv(nb, rows)),
            in_specs=[q_spec, kv_spec, kv_spec],
            out_specs=q_spec,
        ),
        out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "parallel"),
            vmem_limit_bytes=int(min(max(vmem, 32 * _MIB), 100 * _MIB))),
    )(counts, cols, q, k, v)


def kernel(q, k, v, layout):
    batch, heads, seq, _ = q.shape
    nb = pl.cdiv(seq, SPAN)
    if k.shape != q.shape or v.shape != q.shape or layout.shape[1:] != (nb, nb) \
            or layout.shape[0] not in (1, heads):
        raise ValueError(f"expected q, k, v [batch, heads, seq, head_dim] and layout [heads or 1, "
                         f"{nb}, {nb}], got {q.shape=} {k.shape=} {v.shape=} {layout.shape=}")
    rows = max(1, min(BLOCK_Q // SPAN, nb))
    return _block_sparse(q, k, v, layout, rows=rows)
